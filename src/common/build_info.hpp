#pragma once

namespace loom {
// `git describe --always --dirty` of the tree this library was built from (cmake/git_commit.cmake).
const char* build_commit();
}  // namespace loom
