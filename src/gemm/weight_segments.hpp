// The weight rows of one expert's matrix as the GEMMs cut them into 128-row blocks (one weight-scale
// block each): in segments, each cut on its own (ffn w13: the gate rows, then the up rows, so that
// no block spans both when I is not a multiple of 128); a plain matrix is one segment of N rows.
// Block nb of the expert starts at row first_row(nb); its rows past end_row(nb) (the segment's end)
// belong to the next segment or expert: loaded, multiplied, never stored.
#pragma once

#include "common/host_device.hpp"

namespace loom {

struct WeightSegments {
  int rows = 0;    // rows per segment
  int blocks = 0;  // 128-row blocks per segment: ceil(rows / 128)

  static constexpr int kBlockRows = 128;
  static WeightSegments of(int segment_rows) { return WeightSegments{segment_rows, (segment_rows + kBlockRows - 1) / kBlockRows}; }
  // The first segment without a division (a plain matrix has no other).
  LOOM_HOST_DEVICE int first_row(int nb) const {
    if (nb < blocks) return nb * kBlockRows;
    const int seg = nb / blocks;
    return seg * rows + (nb - seg * blocks) * kBlockRows;
  }
  LOOM_HOST_DEVICE int end_row(int nb) const { return nb < blocks ? rows : (nb / blocks + 1) * rows; }
};

}  // namespace loom
