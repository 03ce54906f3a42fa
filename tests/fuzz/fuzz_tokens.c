/* fuzz_tokens.c - libFuzzer harness: any bytes as an llm.c token shard
 * (.bin); open must accept or refuse it, and an accepted shard's tokens
 * must all be readable (n tokens within the file). */
#include "fuzz_input.h"
#include "loom/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, ".bin");
    loom_tokens t;
    if (!path || loom_tokens_open(path, &t) != LOOM_OK) return 0;
    loom_tokens_check_vocab(&t, 256);
    loom_data_check_len(&t, 17, "fuzz");
    loom_tokens_close(&t);
    return 0;
}
