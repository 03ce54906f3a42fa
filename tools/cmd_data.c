/* cmd_data.c - `loom data`: text -> byte-level token shards. */
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "loom/data.h"
#include "loom/log.h"
#include "loom/tokenizer.h"

static void ensure_dir_of(const char *path) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = '\0';
    mkdir(dir, 0755); /* only the last level, as `mkdir` would; errors surface at write */
}

/* One input file = one document: the tokenizer's beginning-of-text token
 * when it has one (Llama 3's <|begin_of_text|>, as its post-processor adds),
 * else "<|endoftext|>" (when the vocabulary has it, as llm.c's GPT-2 shards),
 * then the document's tokens. */
static loom_status encode_doc(void *ctx, const char *text, size_t len, loom_ids *out) {
    loom_tokenizer *tok = ctx;
    int first = loom_tokenizer_bos(tok) >= 0 ? loom_tokenizer_bos(tok) : loom_tokenizer_eot(tok);
    if (first >= 0) LOOM_TRY(loom_ids_push(out, (uint32_t)first));
    return loom_tokenizer_encode(tok, text, len, 0, out);
}

/* The input files, expanded from what --input names (expand_inputs). */
typedef struct inputs {
    char **items;
    int n, cap;
} inputs;

static void inputs_free(inputs *in) {
    for (int i = 0; i < in->n; i++) free(in->items[i]);
    free(in->items);
    memset(in, 0, sizeof *in);
}

static loom_status inputs_add(inputs *in, const char *path) {
    if (in->n == in->cap) {
        int cap = in->cap ? 2 * in->cap : 64;
        char **items = realloc(in->items, (size_t)cap * sizeof *items);
        if (!items) return loom_fail(LOOM_EOS, "out of memory for the input list");
        in->items = items;
        in->cap = cap;
    }
    if (!(in->items[in->n] = strdup(path))) return loom_fail(LOOM_EOS, "out of memory for the input list");
    in->n++;
    return LOOM_OK;
}

/* A directory's regular files (not hidden; skip_corpus: not the fortune
 * indexes .dat and .u8 variants), in name order; not its subdirectories. */
static loom_status add_dir(inputs *in, const char *dir, int skip_corpus) {
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort);
    if (n < 0)
        return loom_fail(LOOM_ENOINPUT, "input %s: cannot read the directory: %s", dir, strerror(errno));
    loom_status st = LOOM_OK;
    int added = 0;
    for (int i = 0; i < n; i++) {
        const char *d = ents[i]->d_name;
        size_t k = strlen(d);
        int skip = d[0] == '.' || (skip_corpus && ((k > 4 && strcmp(d + k - 4, ".dat") == 0) ||
                                                   (k > 3 && strcmp(d + k - 3, ".u8") == 0)));
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, d);
        if (st == LOOM_OK && !skip && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            st = inputs_add(in, path);
            added++;
        }
        free(ents[i]);
    }
    free(ents);
    if (st == LOOM_OK && !added) st = loom_fail(LOOM_ENOINPUT, "input %s: the directory has no files", dir);
    return st;
}

/* One name: - (standard input), @LIST (a file of paths, one a line; blank
 * lines and lines starting with # skipped), a glob pattern (its matches in
 * order), a directory (its files) or a file. */
static loom_status expand_one(inputs *in, const char *name, int depth) {
    struct stat sb;
    if (strcmp(name, "-") == 0) return inputs_add(in, "/dev/stdin");
    if (name[0] == '@' && depth == 0) {
        FILE *f = fopen(name + 1, "r");
        if (!f) return loom_fail(LOOM_ENOINPUT, "input %s: cannot open the list: %s", name, strerror(errno));
        char line[4096];
        loom_status st = LOOM_OK;
        while (st == LOOM_OK && fgets(line, sizeof line, f)) {
            line[strcspn(line, "\r\n")] = '\0';
            if (line[0] && line[0] != '#') st = expand_one(in, line, depth + 1);
        }
        fclose(f);
        return st;
    }
    if (strpbrk(name, "*?[") && stat(name, &sb) != 0) {
        glob_t g;
        int rc = glob(name, 0, NULL, &g);
        loom_status st = rc == 0 ? LOOM_OK : loom_fail(LOOM_ENOINPUT, "input %s: matches no file", name);
        for (size_t i = 0; st == LOOM_OK && i < g.gl_pathc; i++)
            st = stat(g.gl_pathv[i], &sb) == 0 && S_ISDIR(sb.st_mode) ? LOOM_OK
                                                                      : inputs_add(in, g.gl_pathv[i]);
        if (rc == 0) globfree(&g);
        return st;
    }
    if (stat(name, &sb) == 0 && S_ISDIR(sb.st_mode)) return add_dir(in, name, 0);
    return inputs_add(in, name);
}

static loom_status expand_inputs(const cli_strlist *given, inputs *in) {
    memset(in, 0, sizeof *in);
    int stdin_seen = 0;
    for (int i = 0; i < given->n; i++) {
        loom_status st = strcmp(given->items[i], "-") == 0 && stdin_seen++
                             ? loom_fail(LOOM_EUSAGE, "--input -: standard input can be read once")
                             : expand_one(in, given->items[i], 0);
        if (st != LOOM_OK) {
            inputs_free(in);
            return st;
        }
    }
    return LOOM_OK;
}

static loom_status build(const inputs *in, const char *train, const char *val, double frac,
                         const char *tok_path, int verbose) {
    loom_tokenizer *tok = NULL;
    if (tok_path && *tok_path) LOOM_TRY(loom_tokenizer_load(tok_path, &tok));
    ensure_dir_of(train);
    if (val && *val) ensure_dir_of(val);
    size_t nt = 0, nv = 0;
    loom_status st = tok ? loom_data_build_encoded((const char *const *)in->items, in->n, train,
                                                   val && *val ? val : NULL, frac, encode_doc, tok, &nt, &nv)
                         : loom_data_build_bytes((const char *const *)in->items, in->n, train,
                                                 val && *val ? val : NULL, frac, &nt, &nv);
    loom_tokenizer_free(tok);
    LOOM_TRY(st);
    if (verbose && val && *val)
        loom_info("%d input file(s): %zu tokens -> %s, %zu tokens -> %s", in->n, nt, train, nv, val);
    else if (verbose) loom_info("%d input file(s): %zu tokens -> %s", in->n, nt, train);
    return LOOM_OK;
}

/* The default corpus: every fortune file of the Debian package (not the
 * .dat indexes or .u8 variants), in name order. */
static loom_status build_default(const char *train, const char *val, double frac, const char *tok,
                                 int verbose) {
    struct stat sb;
    if (stat(LOOM_DEFAULT_CORPUS_DIR, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return loom_fail(LOOM_ENOINPUT,
                         "default corpus %s not found: install it with `apt-get install "
                         "fortunes-min fortunes` or give --input FILE",
                         LOOM_DEFAULT_CORPUS_DIR);
    inputs in = {0};
    loom_status st = add_dir(&in, LOOM_DEFAULT_CORPUS_DIR, 1);
    if (st == LOOM_OK) st = build(&in, train, val, frac, tok, verbose);
    inputs_free(&in);
    return st;
}

loom_status cli_build_default_data(const char *train, const char *val, int verbose) {
    return build_default(train, val, 0.05, NULL, verbose);
}

/* Everything that can be known before reading a byte: an output that is
 * empty, a directory, or the same file as an input or the other output would
 * fail late or destroy that file. */
static loom_status check_args(const inputs *in, const char *out, const char *val, double frac) {
    if (!(frac >= 0 && frac < 1)) return loom_fail(LOOM_EUSAGE, "--val-fraction %g: must be in [0, 1)", frac);
    if (!out[0]) return loom_fail(LOOM_EUSAGE, "--out needs a file name");
    struct stat sb;
    const char *outs[2] = {out, val}, *flags[2] = {"--out", "--val"};
    for (int k = 0; k < 2; k++) {
        if (!outs[k][0]) continue;
        size_t n = strlen(outs[k]);
        if (outs[k][n - 1] == '/' || (stat(outs[k], &sb) == 0 && S_ISDIR(sb.st_mode)))
            return loom_fail(LOOM_ECANTCREAT, "%s %s: is a directory; give a file name", flags[k], outs[k]);
        for (int i = 0; i < in->n; i++)
            if (cli_same_file(outs[k], in->items[i]))
                return loom_fail(LOOM_EUSAGE, "%s %s is also an --input; it would be overwritten", flags[k],
                                 outs[k]);
    }
    if (val[0] && cli_same_file(out, val))
        return loom_fail(LOOM_EUSAGE, "--out %s and --val %s are the same file", out, val);
    for (int i = 0; i < in->n; i++) {
        if (stat(in->items[i], &sb) != 0)
            return loom_fail(LOOM_ENOINPUT, "input %s: cannot open: %s", in->items[i], strerror(errno));
        if (S_ISDIR(sb.st_mode))
            return loom_fail(LOOM_ENOINPUT, "input %s: is a directory, not a text file", in->items[i]);
    }
    return LOOM_OK;
}

int cmd_data(int argc, char **argv) {
    static char out[1024] = LOOM_DEFAULT_TRAIN, val[1024] = LOOM_DEFAULT_VAL;
    static cli_strlist given;
    static double frac = 0.05;
    static char tok[1024];
    static cli_opt opts[] = {
        {"input", OPT_STRLIST, &given, 0, "FILE|DIR|GLOB|@LIST|-",
         "text to tokenize, repeatable: a file, a directory (its files in name order), a quoted glob "
         "(\"texts/*.txt\"), @LIST (a file naming one input per line) or - (standard input) "
         "(default: the fortunes corpus)"},
        {"out", OPT_STR, out, sizeof out, "PATH", "training shard to write (default " LOOM_DEFAULT_TRAIN ")"},
        {"val", OPT_STR, val, sizeof val, "PATH",
         "validation shard (default " LOOM_DEFAULT_VAL "; \"\" for none)"},
        {"val-fraction", OPT_DOUBLE, &frac, 0, "F",
         "share of tokens, from the end, for validation (default 0.05)"},
        {"tokenizer", OPT_STR, tok, sizeof tok, "DIR",
         "byte-level BPE from DIR's tokenizer.json (GPT-2, Llama 3, Qwen2 kinds), vocab.json+merges.txt or "
         "encoder.json+vocab.bpe"},
    };
    static const cli_cmd cmd = {
        "data",
        "loom data [--input FILE|DIR|GLOB|@LIST|- ...] [--out PATH] [--val PATH] [--val-fraction F] [--tokenizer DIR]",
        "Tokenize text byte by byte (vocab 256), or with a byte-level BPE (--tokenizer), into\n"
        "llm.c-format shards: a 256 x int32 header (magic 20240520, version 1, token\n"
        "count) followed by uint16 tokens (version 2, uint32, when an id passes 65535).\n"
        "With --tokenizer each input file is one document, preceded by the tokenizer's\n"
        "beginning-of-text token (Llama 3's <|begin_of_text|>) or else <|endoftext|> as in\n"
        "llm.c's GPT-2 shards; special-token text in the input stays plain text.\n"
        "Outputs are written to PATH.tmp and renamed when complete.",
        "With no --input, the corpus is every fortune file under " LOOM_DEFAULT_CORPUS_DIR "\n"
        "(Debian packages fortunes-min and fortunes), real English text.\n",
        opts,
        sizeof opts / sizeof opts[0]};
    int help;
    loom_status st = cli_parse(&cmd, argc, argv, 0, &help);
    if (st != LOOM_OK) return cli_fail(st);
    if (help) {
        cli_print_help(&cmd, stdout);
        return 0;
    }
    if (given.n == 0) {
        inputs none = {0};
        st = check_args(&none, out, val, frac);
        return cli_fail(st != LOOM_OK ? st : build_default(out, val, frac, tok, 1));
    }
    inputs in;
    st = expand_inputs(&given, &in);
    if (st != LOOM_OK) return cli_fail(st);
    st = check_args(&in, out, val, frac);
    if (st == LOOM_OK) st = build(&in, out, val, frac, tok, 1);
    inputs_free(&in);
    return cli_fail(st);
}
