// Shapes, routing options and the error type shared by every part of loom.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace loom {

// User-facing error with a one-line message naming the problem (bad shape, option, file).
// Thrown by host code only; bad *device* data is reported through the run's status word.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A CUDA call failed (no device, a launch or an asynchronous error); the message names the call.
class CudaError : public Error {
 public:
  using Error::Error;
};

// single: one expert GEMM per route, K = hidden -> N = inter, fp32 output [T, N].
// ffn:    w13 (hidden -> 2*inter), SiLU(gate)*up, w2 (inter -> hidden), bf16 output [T, hidden].
enum class Mode : int { single, ffn };
// fp8: E4M3 weights with 128x128 block scales, activations quantised per 1x128 group.
// bf16: bf16 weights and activations.
enum class DType : int { fp8, bf16 };
enum class Scoring : int { softmax, sigmoid };

const char* to_string(Mode);
const char* to_string(DType);
const char* to_string(Scoring);
Mode parse_mode(const std::string&);        // throws Error
DType parse_dtype(const std::string&);      // throws Error
Scoring parse_scoring(const std::string&);  // throws Error

struct Shape {
  int64_t tokens = 0;   // T; for plan(), the most tokens one run may carry
  int64_t hidden = 0;   // H; the GEMM's K in single mode
  int64_t inter = 0;    // I; the GEMM's N in single mode
  int64_t experts = 0;  // E
  int64_t topk = 0;     // k
  Mode mode = Mode::single;
  DType dtype = DType::fp8;

  int64_t routes() const { return tokens * topk; }
  // Width of the layer's output row: N in single mode, H in ffn mode.
  int64_t out_cols() const { return mode == Mode::single ? inter : hidden; }
};

struct Routing {
  Scoring scoring = Scoring::softmax;
  float softcap = 0.0f;     // > 0: logit -> softcap * tanh(logit / softcap) before the softmax
  bool renormalize = true;  // divide the k weights by their sum
  int n_group = 1;          // sigmoid only: experts form n_group equal groups ...
  int topk_group = 1;       // ... of which the topk_group best survive the group stage
  float scale = 1.0f;       // multiplies the final weights (both scorings)
};

// Limits that every part (CPU reference, generator, GPU plan) accepts.
inline constexpr int64_t kMaxWidth = 1 << 16;    // H, I
inline constexpr int64_t kMaxExperts = 4096;
inline constexpr int64_t kMaxTokens = 1 << 22;
inline constexpr int64_t kWidthAlign = 16;       // H and I must be multiples of this (TMA rows)

// The GPU path's limits (plan() rejects anything beyond them with a message saying which):
// E <= 512, k <= 16; H and I multiples of 16 up to 65536 (a width that is not a multiple of 128
// ends in a shorter 128-block with its own scale). Every kernel that keeps a per-expert table in
// registers or shared memory sizes it by kGpuMaxExperts.
inline constexpr int64_t kGpuMaxExperts = 512;
inline constexpr int64_t kGpuMaxTopk = 16;

// Throw Error with a one-line message when the shape or routing is not valid.
void validate(const Shape&);
void validate(const Routing&, const Shape&);

std::string describe(const Shape&);    // "T=128 H=2048 I=512 E=256 k=8 fp8 single"
std::string describe(const Routing&);  // "softmax renorm scale=1"

}  // namespace loom
