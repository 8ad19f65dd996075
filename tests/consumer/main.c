/* The C ABI from an installed tree, compiled as C: the ABI version, a plan for a described H200,
 * and a refused shape with its message. */
#include <loom/loom_c.h>

#include <stdio.h>

int main(void) {
  if (loom_abi_version() != LOOM_ABI_VERSION) {
    fprintf(stderr, "c: ABI %u, header %d\n", loom_abi_version(), LOOM_ABI_VERSION);
    return 1;
  }
  loom_routing_t r;
  loom_options_t o;
  loom_routing_default(&r);
  loom_options_default(&o);
  loom_shape_t s = {128, 2048, 512, 256, 8, LOOM_MODE_FFN, LOOM_DTYPE_FP8};
  loom_plan_t p = NULL;
  if (loom_plan_create(&s, &r, &o, "h200", &p) != LOOM_OK) {
    fprintf(stderr, "c: %s\n", loom_last_error());
    return 1;
  }
  printf("c: ABI %u, build %s, workspace %zu bytes\n", loom_abi_version(), loom_build_commit(),
         loom_plan_workspace_bytes(p));
  loom_plan_destroy(p);
  s.hidden = 100;
  if (loom_plan_create(&s, &r, &o, "h200", &p) != LOOM_ERROR_INVALID_ARGUMENT || p != NULL) return 1;
  printf("c: refused as expected: %s\n", loom_last_error());
  return 0;
}
