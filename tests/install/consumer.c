/* consumer.c - a program that embeds loom through its installed files only
 * (tests/install/test_install.py builds it against an installed prefix, once
 * with pkg-config and libloom.so, once with find_package(loom) and
 * libloom.a). It calls the public API and checks what comes back:
 *   1. tokenize: a GPT-2 style tokenizer.json with 4 merges encodes
 *      "hello hello" as [hello, 'Ġ', hello];
 *   2. a forward pass of the built-in tiny model on a batch of a shard;
 *   3. one training step on one rank (loom_train_run): its loss is the
 *      forward pass's, since both see the same parameters and batch.
 * Prints "consumer ok" and exits 0, or names the failed check and exits 1.
 *
 *   consumer WORKDIR
 */
#include <loom/loom.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "consumer: check failed: " __VA_ARGS__);                                         \
            fprintf(stderr, " (%s)\n", loom_errmsg());                                                       \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* GPT-2's byte -> printable code point map, as UTF-8 */
static void byte_char(int b, char *out) {
    int n = 0, cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
}

static void tokenize(const char *dir) {
    char path[1024], ch[4];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f, "cannot write %s", path);
    fprintf(f, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int b = 0; b < 256; b++) {
        byte_char(b, ch);
        fprintf(f, "%s\"%s%s\": %d", b ? ", " : "", b == '"' || b == '\\' ? "\\" : "", ch, b);
    }
    fprintf(f, ", \"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259},");
    fprintf(f, " \"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\"]}}\n");
    fclose(f);
    loom_tokenizer *tok;
    CHECK(loom_tokenizer_load(path, &tok) == LOOM_OK, "loom_tokenizer_load %s", path);
    loom_ids ids = {0};
    CHECK(loom_tokenizer_encode(tok, "hello hello", 11, 0, &ids) == LOOM_OK, "encode");
    CHECK(ids.n == 3 && ids.v[0] == 259 && ids.v[1] == ' ' && ids.v[2] == 259,
          "\"hello hello\" encoded as %zu ids, expected [259, 32, 259]", ids.n);
    printf("tokenize: [%u, %u, %u]\n", ids.v[0], ids.v[1], ids.v[2]);
    loom_ids_free(&ids);
    loom_tokenizer_free(tok);
}

/* Mean loss of the tiny model (seed 1337) on step 0's batch of the shard. */
static double forward(loom_device *dev, const char *data, int B, int T) {
    loom_model_config cfg;
    CHECK(loom_model_config_builtin("tiny", &cfg) == LOOM_OK, "tiny config");
    loom_model_part part = loom_model_part_whole(dev, &cfg);
    loom_gpt_opts opts = {.B = B, .T = T, .n_slots = 1};
    loom_gpt *m;
    CHECK(loom_gpt_create(&cfg, &part, &opts, &m) == LOOM_OK, "loom_gpt_create");
    loom_gpt_init_params(m, 1337);
    loom_tokens t;
    CHECK(loom_tokens_open(data, &t) == LOOM_OK, "open %s", data);
    int32_t in[64 * 64], tg[64 * 64];
    loom_data_sample(&t, 1337, 0, B, 0, B, T, in, tg);
    double loss_sum = 0;
    CHECK(loom_gpt_forward(m, 0, in, tg, &loss_sum) == LOOM_OK, "forward");
    loom_tokens_close(&t);
    loom_gpt_free(m);
    double loss = loss_sum / (B * T);
    CHECK(isfinite(loss) && fabs(loss - log(256.0)) < 0.5, "forward loss %g, expected about ln 256", loss);
    printf("forward: loss %.6f\n", loss);
    return loss;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: consumer WORKDIR\n");
        return 64;
    }
    printf("loom %s (commit %s)\n", loom_version(), loom_version_commit());
    tokenize(argv[1]);

    char data[1024];
    snprintf(data, sizeof data, "%s/tokens.bin", argv[1]);
    uint32_t tokens[4096];
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 4096; i++) x ^= x << 13, x ^= x >> 7, x ^= x << 17, tokens[i] = (uint32_t)(x % 256);
    CHECK(loom_tokens_write(data, tokens, 4096) == LOOM_OK, "write %s", data);

    loom_comm *world;
    CHECK(loom_comm_init(&argc, &argv, &world) == LOOM_OK, "loom_comm_init");
    CHECK(loom_comm_size(world) == 1, "world of %d ranks, expected 1", loom_comm_size(world));
    loom_device *dev;
    const loom_device_opts dopts = {.name = "cpu", .threads = 1};
    CHECK(loom_device_create(&dopts, &dev) == LOOM_OK, "loom_device_create");
    const int B = 2, T = 16;
    double loss = forward(dev, data, B, T);

    static loom_train_config c;
    loom_train_config_default(&c);
    snprintf(c.model, sizeof c.model, "tiny");
    snprintf(c.data, sizeof c.data, "%s", data);
    c.steps = 1;
    c.batch = B;
    c.seq = T;
    c.threads = 1;
    c.peak_flops = 1e9; /* no calibration */
    c.quiet = 1;
    c.progress = 0;
    loom_train_result res;
    CHECK(loom_train_run(&c, dev, world, &res) == LOOM_OK, "loom_train_run");
    CHECK(res.steps_done == 1 && fabs(res.final_loss - loss) <= 1e-5 * fabs(loss),
          "training step: %d steps, loss %.9g, expected the forward pass's %.9g", res.steps_done,
          res.final_loss, loss);
    printf("train: 1 step, loss %.6f\n", res.final_loss);
    loom_device_free(dev);
    loom_comm_finalize(world);
    printf("consumer ok\n");
    return 0;
}
