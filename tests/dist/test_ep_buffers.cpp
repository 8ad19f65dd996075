// Expert parallelism's buffer sizing: the default caps, the row sizes by dtype, and invalid specs.
#include <gtest/gtest.h>

#include "dist/ep_buffers.hpp"
#include "loom/types.hpp"

namespace loom::dist {
namespace {

TEST(EpBuffers, DefaultCapIsTwiceABalancedShare) {
  EXPECT_EQ(default_rows_per_peer(4096, 8, 2), 32768);  // twice the share is every route
  EXPECT_EQ(default_rows_per_peer(4096, 8, 8), 8192);
  EXPECT_EQ(default_rows_per_peer(128, 8, 8), 256);
  EXPECT_EQ(default_rows_per_peer(1, 8, 8), 8);   // never more than T k
  EXPECT_EQ(default_rows_per_peer(3, 1, 8), 3);
  EXPECT_EQ(default_rows_per_peer(100, 1, 3), 80);  // ceil(200 / 3) = 67, up to 16 rows
  EXPECT_EQ(default_rows_per_peer(0, 8, 4), 0);
  EXPECT_EQ(default_tokens_per_peer(4096, 8, 8), 4096);  // every token may have a route to each rank
  EXPECT_EQ(default_tokens_per_peer(4096, 8, 64), 1024);
  EXPECT_EQ(default_tokens_per_peer(100, 1, 3), 80);
}

TEST(EpBuffers, RowBytesAndTotals) {
  BufferSpec s;
  s.tokens = 128;
  s.topk = 8;
  s.hidden = 7168;
  s.ranks = 8;
  const Buffers f = buffer_bytes(s);
  EXPECT_EQ(f.rows_per_peer, 256);
  EXPECT_EQ(f.tokens_per_peer, 128);
  EXPECT_EQ(f.row_bytes, 7168 + 56 * 4 + 8 * 12);  // codes, 56 scales, 8 slots' id, weight and return row
  EXPECT_EQ(f.return_row_bytes, 2 * 7168);
  EXPECT_EQ(f.send, size_t(8) * 128 * f.row_bytes);
  EXPECT_EQ(f.recv, f.send);
  EXPECT_EQ(f.out_local, size_t(8) * 256 * 2 * 7168);
  EXPECT_EQ(f.total(), 2 * f.send + 2 * f.out_local);
  s.dtype = DType::bf16;
  s.hidden = 2880;  // 2880 / 128 is not whole: 23 scale blocks for fp8, none for bf16
  s.rows_per_peer = 100;
  const Buffers b = buffer_bytes(s);
  EXPECT_EQ(b.rows_per_peer, 100);
  EXPECT_EQ(b.row_bytes, 2 * 2880 + 96);  // 8 slots x 12 bytes
  s.dtype = DType::fp8;
  EXPECT_EQ(buffer_bytes(s).row_bytes, 2880 + 96 + 96);  // 23 scales = 92 bytes, padded to 96
  s.chunks = 3;  // the cap rounded up to whole chunks of a multiple of 4 rows: 34 -> 36
  EXPECT_EQ(buffer_bytes(s).rows_per_peer, 108);
  s.chunks = 4;  // 25 -> 28
  EXPECT_EQ(buffer_bytes(s).rows_per_peer, 112);
  s.chunks = 5;
  EXPECT_EQ(buffer_bytes(s).rows_per_peer, 100);
  s.tokens_per_peer = 30;  // 6 a part -> 8
  EXPECT_EQ(buffer_bytes(s).tokens_per_peer, 40);
}

TEST(EpBuffers, RejectsInvalidSpecs) {
  BufferSpec s;
  s.tokens = 16;
  s.topk = 2;
  s.hidden = 1024;
  s.ranks = 2;
  EXPECT_NO_THROW(buffer_bytes(s));
  BufferSpec bad = s;
  bad.ranks = 0;
  EXPECT_THROW(buffer_bytes(bad), Error);
  bad = s;
  bad.hidden = 1000;  // not a multiple of 16
  EXPECT_THROW(buffer_bytes(bad), Error);
  bad = s;
  bad.chunks = 0;
  EXPECT_THROW(buffer_bytes(bad), Error);
  bad.chunks = kMaxChunks + 1;
  EXPECT_THROW(buffer_bytes(bad), Error);
  bad = s;
  bad.rows_per_peer = 33;  // above T k
  EXPECT_THROW(buffer_bytes(bad), Error);
  bad.rows_per_peer = -1;
  EXPECT_THROW(buffer_bytes(bad), Error);
  bad = s;
  bad.tokens_per_peer = 17;  // above T
  EXPECT_THROW(buffer_bytes(bad), Error);
  bad = s;
  bad.tokens = -1;
  EXPECT_THROW(buffer_bytes(bad), Error);
}

}  // namespace
}  // namespace loom::dist
