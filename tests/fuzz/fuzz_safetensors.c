/* fuzz_safetensors.c - libFuzzer harness: any bytes as a .safetensors file;
 * open must accept or refuse it (never crash, leak or read out of bounds),
 * and every tensor it accepts must convert to float32 within its bytes. */
#include "fuzz_input.h"
#include "loom/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, ".safetensors");
    loom_st_file *f;
    if (!path || loom_st_open(path, &f) != LOOM_OK) return 0;
    loom_st_metadata(f, "format");
    for (int i = 0; i < loom_st_count(f); i++) {
        const loom_st_tensor *t = loom_st_at(f, i);
        if (loom_st_find(f, t->name) != t) abort(); /* names are unique */
        if (t->numel > (1u << 20)) continue;
        float *dst = malloc((t->numel ? t->numel : 1) * sizeof *dst);
        if (dst) loom_st_read_f32(f, t, dst);
        free(dst);
    }
    loom_st_close(f);
    return 0;
}
