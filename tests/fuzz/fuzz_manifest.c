/* fuzz_manifest.c - libFuzzer harness: any bytes as a checkpoint
 * manifest.json; validation must accept or refuse without crashing, and
 * what it accepts is what --resume and export then read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    loom_ckpt_manifest_check(text);
    free(text);
    return 0;
}
