/* test_data.c - token shards, the byte tokenizer and the batch sampler.
 *
 * Shards: v1/v2 round trips, and every malformed shard (truncated, bad magic,
 * bad version, count mismatch, empty, missing) fails with the right status
 * and a message naming the file and the numbers. Tokenizer: bytes in, bytes
 * out, inputs concatenated, the val split, nothing written on failure.
 * Sampler: a pure function of its arguments, start positions exactly as
 * specified, slicing a batch across data-parallel ranks gives the same
 * samples, targets are the inputs shifted by one. */
#include "check.h"
#include "loom/data.h"
#include "loom/rng.h"

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *scratch; /* check_scratch_dir */

static size_t file_size(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    fseek(fp, 0, SEEK_END);
    size_t n = (size_t)ftell(fp);
    fclose(fp);
    return n;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* A shard with the given header words and n_payload bytes of payload. */
static void write_shard_raw(const char *path, int32_t magic, int32_t version, int32_t count, size_t payload) {
    size_t total = 1024 + payload;
    unsigned char *b = calloc(1, total);
    int32_t hdr[3] = {magic, version, count};
    memcpy(b, hdr, sizeof hdr);
    check_write_bytes(path, b, total);
    free(b);
}

static void expect_open_fails(const char *label, const char *path, loom_status want, const char *w1,
                              const char *w2) {
    loom_tokens t;
    loom_clear_error();
    loom_status st = loom_tokens_open(path, &t);
    CHECK(st == want, "%s: status %d, expected %d (%s)", label, st, want, loom_errmsg());
    CHECK(t.map == NULL && t.n == 0, "%s: nothing mapped after a failure", label);
    CHECK(strstr(loom_errmsg(), path) != NULL, "%s: message does not name the file: %s", label,
          loom_errmsg());
    CHECK(!w1 || strstr(loom_errmsg(), w1), "%s: message lacks '%s': %s", label, w1, loom_errmsg());
    CHECK(!w2 || strstr(loom_errmsg(), w2), "%s: message lacks '%s': %s", label, w2, loom_errmsg());
    if (st == LOOM_OK) loom_tokens_close(&t);
}

/* The scratch path of NAME's tmp file while process PID writes it. */
static const char *tmp_of_pid(const char *name, pid_t pid) {
    char t[200];
    snprintf(t, sizeof t, "%s.tmp.%ld", name, (long)pid);
    return check_scratch_path(t);
}

/* ... while this process writes it. */
static const char *tmp_of(const char *name) { return tmp_of_pid(name, getpid()); }

static void test_round_trip(void) {
    uint32_t v1[5] = {0, 1, 50256, 65535, 7};
    uint32_t v2[4] = {0, 65536, 100000, 4000000000u};
    const char *p1 = check_scratch_path("v1.bin"), *p2 = check_scratch_path("v2.bin");
    CHECK(loom_tokens_write(p1, v1, 5) == LOOM_OK, "write v1: %s", loom_errmsg());
    CHECK(loom_tokens_write(p2, v2, 4) == LOOM_OK, "write v2: %s", loom_errmsg());
    CHECK(file_size(p1) == 1024 + 5 * 2 && file_size(p2) == 1024 + 4 * 4, "shard sizes");
    CHECK(!exists(tmp_of("v1.bin")), "no tmp left");
    loom_tokens t;
    CHECK(loom_tokens_open(p1, &t) == LOOM_OK, "open v1: %s", loom_errmsg());
    CHECK(t.version == 1 && t.n == 5, "v1: version %d n %zu", t.version, t.n);
    for (size_t i = 0; i < 5 && i < t.n; i++) CHECK(loom_tokens_get(&t, i) == v1[i], "v1 token %zu", i);
    loom_tokens_close(&t);
    CHECK(loom_tokens_open(p2, &t) == LOOM_OK, "open v2: %s", loom_errmsg());
    CHECK(t.version == 2 && t.n == 4, "v2: version %d n %zu", t.version, t.n);
    for (size_t i = 0; i < 4 && i < t.n; i++) CHECK(loom_tokens_get(&t, i) == v2[i], "v2 token %zu", i);
    loom_tokens_close(&t);
    CHECK(t.map == NULL, "close unmaps");

    CHECK(loom_tokens_write(check_scratch_path("empty.bin"), v1, 0) == LOOM_EDATA,
          "writing 0 tokens is LOOM_EDATA");
    CHECK(!exists(check_scratch_path("empty.bin")) && !exists(tmp_of("empty.bin")), "nothing written");
    const char *nodir = check_scratch_path("no/such/dir.bin");
    CHECK(loom_tokens_write(nodir, v1, 5) == LOOM_ECANTCREAT, "missing dir: %s", loom_errmsg());
    CHECK(strstr(loom_errmsg(), nodir) != NULL, "message names the path: %s", loom_errmsg());
}

static void test_malformed(void) {
    const char *p = check_scratch_path("bad.bin");
    uint32_t toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    CHECK(loom_tokens_write(p, toks, 10) == LOOM_OK, "write: %s", loom_errmsg());
    CHECK(truncate(p, 1024 + 20 - 3) == 0, "truncate");
    expect_open_fails("truncated tokens", p, LOOM_EDATA, "10 tokens", "17 bytes");
    CHECK(truncate(p, 100) == 0, "truncate");
    expect_open_fails("truncated header", p, LOOM_EDATA, "100 bytes", NULL);
    check_write_bytes(p, "", 0);
    expect_open_fails("empty file", p, LOOM_EDATA, "0 bytes", NULL);
    write_shard_raw(p, 20240521, 1, 10, 20);
    expect_open_fails("bad magic", p, LOOM_EDATA, "20240521", NULL);
    write_shard_raw(p, LOOM_TOKENS_MAGIC, 3, 10, 20);
    expect_open_fails("bad version", p, LOOM_EDATA, "version 3", NULL);
    write_shard_raw(p, LOOM_TOKENS_MAGIC, 1, 11, 20);
    expect_open_fails("count larger than the file", p, LOOM_EDATA, "11 tokens", "20 bytes");
    write_shard_raw(p, LOOM_TOKENS_MAGIC, 2, 4, 20);
    expect_open_fails("count smaller than the file", p, LOOM_EDATA, "4 tokens", "20 bytes");
    write_shard_raw(p, LOOM_TOKENS_MAGIC, 2, -5, 20);
    expect_open_fails("negative count", p, LOOM_EDATA, "-5 tokens", "negative");
    CHECK(!strstr(loom_errmsg(), "4294967291"), "negative count printed as unsigned: %s", loom_errmsg());
    write_shard_raw(p, LOOM_TOKENS_MAGIC, 1, 0, 0);
    expect_open_fails("empty shard", p, LOOM_EDATA, "empty", NULL);
    expect_open_fails("missing file", check_scratch_path("missing.bin"), LOOM_ENOINPUT, NULL, NULL);
    expect_open_fails("directory", scratch, LOOM_ENOINPUT, NULL, NULL);
}

static void test_vocab_and_len(void) {
    uint32_t toks[6] = {1, 2, 255, 300, 4, 256};
    const char *p = check_scratch_path("vocab.bin");
    CHECK(loom_tokens_write(p, toks, 6) == LOOM_OK, "write: %s", loom_errmsg());
    loom_tokens t;
    CHECK(loom_tokens_open(p, &t) == LOOM_OK, "open: %s", loom_errmsg());
    CHECK(loom_tokens_check_vocab(&t, 301) == LOOM_OK, "all tokens < 301");
    CHECK(loom_tokens_check_vocab(&t, 256) == LOOM_EDATA, "token 300 >= 256");
    const char *m = loom_errmsg();
    CHECK(strstr(m, p) && strstr(m, "300") && strstr(m, "index 3") && strstr(m, "256"),
          "message names file, token, index and vocab: %s", m);
    CHECK(loom_tokens_check_vocab(&t, 0) == LOOM_EUSAGE, "vocab 0");
    CHECK(loom_data_check_len(&t, 6, "--seq 5") == LOOM_OK, "6 tokens suffice");
    CHECK(loom_data_check_len(&t, 7, "--seq 6") == LOOM_EDATA, "7 tokens needed");
    m = loom_errmsg();
    CHECK(strstr(m, p) && strstr(m, "--seq 6") && strstr(m, "6 tokens") && strstr(m, "7"), "message: %s", m);
    loom_tokens_close(&t);
}

/* A v2 shard whose token at position i is i + 1000, so a window's first
 * input tells where it starts. */
static void open_counting_shard(loom_tokens *t, size_t n) {
    uint32_t *toks = malloc(n * sizeof *toks);
    for (size_t i = 0; i < n; i++) toks[i] = (uint32_t)(i + 70000);
    const char *p = check_scratch_path("count.bin");
    CHECK(loom_tokens_write(p, toks, n) == LOOM_OK, "write: %s", loom_errmsg());
    CHECK(loom_tokens_open(p, t) == LOOM_OK, "open: %s", loom_errmsg());
    free(toks);
}

static void test_sampler(void) {
    enum { N = 1000, T = 16, B = 8 };
    loom_tokens t;
    open_counting_shard(&t, N);
    int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];
    loom_data_sample(&t, 1234, 5, B, 0, B, T, in, tg);
    loom_data_sample(&t, 1234, 5, B, 0, B, T, in2, tg2);
    CHECK(memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0, "same arguments, same batch");

    /* Start positions as specified: u64(key(seed, "data"), s*B + g) % (n - T). */
    loom_rng_key key = loom_rng_key_make(1234, "data");
    int bad_pos = 0, bad_shift = 0, bad_window = 0;
    for (int j = 0; j < B; j++) {
        uint64_t pos = loom_rng_u64(key, 5 * B + (uint64_t)j) % (N - T);
        bad_pos += in[j * T] != (int32_t)(pos + 70000);
        for (int i = 0; i < T; i++) {
            bad_window += in[j * T + i] != in[j * T] + i;
            bad_shift += tg[j * T + i] != in[j * T + i] + 1;
        }
    }
    CHECK(bad_pos == 0, "%d samples start at the wrong position", bad_pos);
    CHECK(bad_window == 0, "%d inputs are not a contiguous window", bad_window);
    CHECK(bad_shift == 0, "%d targets are not the inputs shifted by one", bad_shift);

    /* Data-parallel slicing: samples [0, 4) and [4, 8) are the batch's halves. */
    loom_data_sample(&t, 1234, 5, B, 0, B / 2, T, in2, tg2);
    loom_data_sample(&t, 1234, 5, B, B / 2, B / 2, T, in2 + B / 2 * T, tg2 + B / 2 * T);
    CHECK(memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0, "two halves equal the whole");

    loom_data_sample(&t, 1234, 6, B, 0, B, T, in2, tg2);
    CHECK(memcmp(in, in2, sizeof in) != 0, "another step gives another batch");
    loom_data_sample(&t, 1235, 5, B, 0, B, T, in2, tg2);
    CHECK(memcmp(in, in2, sizeof in) != 0, "another seed gives another batch");

    /* Every start in [0, n - T) is reachable and none beyond: the last target
     * is at most token n - 1. With n = T + 1 the only window is the file. */
    int32_t lo = INT32_MAX, hi = 0;
    for (int s = 0; s < 20000; s++) {
        loom_data_sample(&t, 7, s, 1, 0, 1, T, in2, tg2);
        lo = in2[0] < lo ? in2[0] : lo;
        hi = tg2[T - 1] > hi ? tg2[T - 1] : hi;
    }
    CHECK(lo == 70000 && hi == 70000 + N - 1, "windows span [%d, %d]", lo - 70000, hi - 70000);
    loom_tokens_close(&t);

    open_counting_shard(&t, T + 1);
    loom_data_sample(&t, 99, 3, 4, 2, 1, T, in2, tg2);
    CHECK(in2[0] == 70000 && tg2[T - 1] == 70000 + T, "n = T + 1: the one window");
    loom_tokens_close(&t);
}

static void test_sequential(void) {
    enum { T = 4 };
    loom_tokens t;
    open_counting_shard(&t, 13); /* (13 - 1) / 4 = 3 whole sequences */
    int32_t in[3 * T], tg[3 * T];
    loom_data_sequential(&t, 1, 3, T, in, tg);
    const int starts[3] = {4, 8, 0}; /* sequence 3 wraps to sequence 0 */
    int bad = 0;
    for (int j = 0; j < 3; j++) {
        for (int i = 0; i < T; i++) {
            bad += in[j * T + i] != 70000 + starts[j] + i;
            bad += tg[j * T + i] != 70000 + starts[j] + i + 1;
        }
    }
    CHECK(bad == 0, "%d sequential tokens wrong", bad);
    loom_tokens_close(&t);
}

static void test_build_bytes(void) {
    const char *a = check_scratch_path("a.txt"), *b = check_scratch_path("b.txt");
    check_write_bytes(a, "Hello, ", 7);
    check_write_bytes(b, "w\xc3\xb6rld\n\xff\x00!", 11);
    const char *text = "Hello, w\xc3\xb6rld\n\xff\x00!";
    const char *inputs[2] = {a, b};
    const char *train = check_scratch_path("train.bin"), *val = check_scratch_path("val.bin");
    size_t nt = 0, nv = 0;
    CHECK(loom_data_build_bytes(inputs, 2, train, val, 0.2, &nt, &nv) == LOOM_OK, "build: %s", loom_errmsg());
    CHECK(nt == 14 && nv == 4, "18 bytes x 0.2 = 3.6 rounds to 4 val: train %zu val %zu", nt, nv);
    loom_tokens t;
    CHECK(loom_tokens_open(train, &t) == LOOM_OK, "open train: %s", loom_errmsg());
    CHECK(t.version == 1 && t.n == 14, "train: v%d, %zu tokens", t.version, t.n);
    int bad = 0;
    for (size_t i = 0; i < t.n && i < 14; i++) bad += loom_tokens_get(&t, i) != (unsigned char)text[i];
    CHECK(bad == 0, "train tokens are the bytes (%d differ)", bad);
    loom_tokens_close(&t);
    CHECK(loom_tokens_open(val, &t) == LOOM_OK, "open val: %s", loom_errmsg());
    bad = t.n != 4;
    for (size_t i = 0; i < t.n && i < 4; i++) bad += loom_tokens_get(&t, i) != (unsigned char)text[14 + i];
    CHECK(bad == 0, "val holds the tail");
    loom_tokens_close(&t);

    const char *all = check_scratch_path("all.bin");
    CHECK(loom_data_build_bytes(inputs, 2, all, NULL, 0.25, &nt, &nv) == LOOM_OK, "no val: %s",
          loom_errmsg());
    CHECK(nt == 18 && nv == 0, "without val everything goes to train: %zu %zu", nt, nv);
    CHECK(file_size(all) == 1024 + 18 * 2, "all.bin size");

    /* Failures write nothing: the earlier train/val shards stay as they were. */
    size_t old_train = file_size(train), old_val = file_size(val);
    const char *missing[3] = {a, check_scratch_path("nope.txt"), b};
    CHECK(loom_data_build_bytes(missing, 3, train, val, 0.1, NULL, NULL) == LOOM_ENOINPUT, "missing input");
    CHECK(strstr(loom_errmsg(), "nope.txt") != NULL, "message names the input: %s", loom_errmsg());
    const char *empty = check_scratch_path("empty.txt");
    check_write_bytes(empty, "", 0);
    CHECK(loom_data_build_bytes(&empty, 1, train, val, 0.1, NULL, NULL) == LOOM_EDATA, "empty input");
    CHECK(loom_data_build_bytes(inputs, 2, train, val, 0.01, NULL, NULL) == LOOM_EDATA, "val rounds to 0");
    CHECK(loom_data_build_bytes(inputs, 2, train, val, 1.5, NULL, NULL) == LOOM_EUSAGE, "fraction 1.5");
    CHECK(loom_data_build_bytes(inputs, 2, train, check_scratch_path("no/dir/val.bin"), 0.5, NULL, NULL) ==
              LOOM_ECANTCREAT,
          "unwritable val: %s", loom_errmsg());
    CHECK(file_size(train) == old_train && file_size(val) == old_val, "outputs untouched by failures");
    CHECK(!exists(tmp_of("train.bin")) && !exists(tmp_of("val.bin")), "no tmp files left");
}

static int same_bytes(const char *path, const char *want, size_t n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    char buf[256];
    size_t got = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    return got == n && memcmp(buf, want, n) == 0;
}

/* Invariant 5: outputs that name each other or an input are refused before
 * anything is written, and a directory given as input is a missing input. */
static void test_build_bytes_refusals(void) {
    const char *in = check_scratch_path("in.txt");
    check_write_bytes(in, "some text to tokenize, long enough for a val split!", 51);
    const char *inputs[1] = {in};
    const char *train = check_scratch_path("keep_train.bin"), *val = check_scratch_path("keep_val.bin");
    check_write_bytes(train, "OLD TRAIN", 9);
    check_write_bytes(val, "OLD VAL", 7);

    /* the same path twice: the val split used to overwrite the train split */
    loom_clear_error();
    loom_status st = loom_data_build_bytes(inputs, 1, train, train, 0.2, NULL, NULL);
    const char *m = loom_errmsg();
    CHECK(st == LOOM_EUSAGE, "train == val: status %d, expected %d (%s)", st, LOOM_EUSAGE, m);
    CHECK(strstr(m, "train shard") && strstr(m, "val shard") && strstr(m, train), "train == val message: %s",
          m);
    CHECK(same_bytes(train, "OLD TRAIN", 9), "train == val: the existing train file changed");
    CHECK(!exists(tmp_of("keep_train.bin")), "train == val: a tmp file was left");

    /* the same file spelled two ways, existing and not yet existing */
    char dotted[256], fresh_a[256], fresh_b[256];
    snprintf(dotted, sizeof dotted, "%s/./keep_train.bin", scratch);
    st = loom_data_build_bytes(inputs, 1, train, dotted, 0.2, NULL, NULL);
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), dotted), "train == ./val: %d %s", st, loom_errmsg());
    snprintf(fresh_a, sizeof fresh_a, "%s/fresh.bin", scratch);
    snprintf(fresh_b, sizeof fresh_b, "%s/../%s/fresh.bin", scratch, strrchr(scratch, '/') + 1);
    st = loom_data_build_bytes(inputs, 1, fresh_a, fresh_b, 0.2, NULL, NULL);
    CHECK(st == LOOM_EUSAGE, "new train == new val (other spelling): %d %s", st, loom_errmsg());
    CHECK(!exists(fresh_a) && !exists(tmp_of("fresh.bin")), "refused build created a file");

    /* val = train's tmp file: writing train.tmp.PID would clobber the val file */
    const char *val_tmp = tmp_of("keep_train.bin");
    check_write_bytes(val_tmp, "OLD VAL", 7);
    st = loom_data_build_bytes(inputs, 1, train, val_tmp, 0.2, NULL, NULL);
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), val_tmp), "val == train.tmp: %d %s", st, loom_errmsg());
    CHECK(same_bytes(val_tmp, "OLD VAL", 7) && same_bytes(train, "OLD TRAIN", 9),
          "val == train.tmp: files changed");
    unlink(val_tmp);

    /* an output over an input */
    st = loom_data_build_bytes(inputs, 1, in, val, 0.2, NULL, NULL);
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), in), "train == input: %d %s", st, loom_errmsg());
    st = loom_data_build_bytes(inputs, 1, train, in, 0.2, NULL, NULL);
    CHECK(st == LOOM_EUSAGE && strstr(loom_errmsg(), in), "val == input: %d %s", st, loom_errmsg());
    CHECK(file_size(in) == 51, "refused build changed the input");
    CHECK(same_bytes(train, "OLD TRAIN", 9) && same_bytes(val, "OLD VAL", 7), "refusals changed the outputs");

    /* a directory as input: a missing input, not an I/O error */
    const char *dir_in[2] = {in, scratch};
    loom_clear_error();
    st = loom_data_build_bytes(dir_in, 2, train, val, 0.2, NULL, NULL);
    m = loom_errmsg();
    CHECK(st == LOOM_ENOINPUT, "directory input: status %d, expected %d (%s)", st, LOOM_ENOINPUT, m);
    CHECK(strstr(m, scratch) && strstr(m, "is a directory"), "directory input message: %s", m);
    CHECK(same_bytes(train, "OLD TRAIN", 9) && same_bytes(val, "OLD VAL", 7),
          "directory input changed outputs");

    /* distinct outputs still work */
    size_t nt = 0, nv = 0;
    CHECK(loom_data_build_bytes(inputs, 1, train, val, 0.2, &nt, &nv) == LOOM_OK, "build: %s", loom_errmsg());
    CHECK(nt == 41 && nv == 10, "51 bytes x 0.2 -> 41 train, 10 val: %zu %zu", nt, nv);
}

/* Two processes building the same shards at once - two first runs of
 * `loom train` in one folder, each building the default data set - both
 * succeed and leave complete shards and no tmp file. With one PATH.tmp
 * for both, one's fopen truncated the other's file and the second rename
 * failed (ENOENT). */
static void test_build_concurrent(void) {
    enum { BYTES = 1 << 20, ROUNDS = 12, WRITERS = 3 };
    const char *in = check_scratch_path("conc.txt");
    char *text = malloc(BYTES);
    CHECK(text != NULL, "out of memory");
    if (!text) return;
    for (size_t i = 0; i < BYTES; i++) text[i] = (char)('a' + i % 26);
    check_write_bytes(in, text, BYTES);
    free(text);
    char train[256], val[256];
    snprintf(train, sizeof train, "%s", check_scratch_path("conc_train.bin"));
    snprintf(val, sizeof val, "%s", check_scratch_path("conc_val.bin"));
    const char *inputs[1] = {in};
    pid_t kids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        kids[w] = fork();
        if (kids[w] == 0) {
            int fails = 0;
            for (int r = 0; r < ROUNDS; r++)
                if (loom_data_build_bytes(inputs, 1, train, val, 0.1, NULL, NULL) != LOOM_OK) {
                    fprintf(stderr, "writer %d round %d: %s\n", w, r, loom_errmsg());
                    fails++;
                }
            _exit(fails ? 1 : 0);
        }
        CHECK(kids[w] > 0, "fork failed");
    }
    for (int w = 0; w < WRITERS; w++) {
        int status = 0;
        if (kids[w] > 0) waitpid(kids[w], &status, 0);
        CHECK(kids[w] > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "writer %d: a concurrent build failed (status %d)", w, status);
    }
    loom_tokens t;
    CHECK(loom_tokens_open(train, &t) == LOOM_OK, "open train: %s", loom_errmsg());
    size_t want = BYTES - (size_t)(0.1 * BYTES + 0.5), bad = 0;
    CHECK(t.n == want, "train shard has %zu tokens, expected %zu", t.n, want);
    for (size_t i = 0; i < t.n; i++) bad += loom_tokens_get(&t, i) != (uint32_t)('a' + i % 26);
    CHECK(bad == 0, "%zu train tokens wrong", bad);
    loom_tokens_close(&t);
    CHECK(loom_tokens_open(val, &t) == LOOM_OK && t.n == BYTES - want, "open val: %s", loom_errmsg());
    loom_tokens_close(&t);
    /* no writer's tmp file is left */
    int left = 0;
    for (int w = 0; w < WRITERS; w++)
        left += exists(tmp_of_pid("conc_train.bin", kids[w])) + exists(tmp_of_pid("conc_val.bin", kids[w]));
    CHECK(left == 0, "%d tmp files left", left);
}

int main(void) {
    scratch = check_scratch_dir("data");
    if (!scratch) return check_done();
    test_round_trip();
    test_malformed();
    test_vocab_and_len();
    test_sampler();
    test_sequential();
    test_build_bytes();
    test_build_bytes_refusals();
    test_build_concurrent();
    return check_done();
}
