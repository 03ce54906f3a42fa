/* fuzz_config.c - libFuzzer harness: any bytes as a model config.json;
 * load must accept a config that passes its own check, or refuse. */
#include "fuzz_input.h"
#include "loom/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, ".json");
    loom_model_config c;
    if (path && loom_model_config_load(path, &c) == LOOM_OK && loom_model_config_check(&c) != LOOM_OK)
        abort(); /* load returned a config its own check refuses */
    return 0;
}
