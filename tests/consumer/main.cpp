// The C++ API from an installed tree: plan the qwen35-layer shape for a described H200 and print
// the workspace size and the GEMM config at the plan's most tokens.
#include <loom/loom.hpp>

#include <iostream>

int main() {
  try {
    const loom::Shape s{128, 2048, 512, 256, 8, loom::Mode::ffn, loom::DType::fp8};
    const loom::Plan p = loom::plan(s, loom::Routing{}, loom::Options{}, loom::device_spec("h200"));
    std::cout << "c++: workspace " << loom::workspace_bytes(p) << " bytes, gemm config " << p.gemm_config << "\n";
    return loom::workspace_bytes(p) > 0 ? 0 : 1;
  } catch (const loom::Error& e) {
    std::cerr << "c++: " << e.what() << "\n";
    return 1;
  }
}
