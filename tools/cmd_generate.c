/* cmd_generate.c - `loom generate`: prompts -> continuations with a KV
 * cache, on one rank or tp x pp ranks. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "loom/comm.h"
#include "loom/hf_dir.h"
#include "loom/infer.h"
#include "loom/kernels.h"
#include "loom/log.h"
#include "loom/mesh.h"
#include "loom/tokenizer.h"

typedef struct gen_cfg {
    char model[1024], load_params[1024], tokenizer[1024], ids_file[1024], stop[1024], format[16];
    char logits_out[1024];
    cli_strlist prompts, ids;
    int max_tokens, top_k, tp, pp, ep, threads, max_len, check_kv;
    double temperature, top_p;
    uint64_t seed;
} gen_cfg;

/* "1,2 3" -> ids. LOOM_EUSAGE naming what is not a token id. */
static loom_status parse_ids(const char *what, const char *s, loom_ids *out) {
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && !strchr(", \t\r\n", *end)))
            return loom_fail(LOOM_EUSAGE, "%s: '%.20s' is not a token id", what, p);
        LOOM_TRY(loom_ids_push(out, (uint32_t)v));
        p = end;
    }
    return LOOM_OK;
}

/* Every prompt as token ids: --prompt texts (tokenized), --ids lists, then
 * the lines of --ids-file. */
static loom_status collect_prompts(const gen_cfg *c, loom_tokenizer *tok, loom_ids *prompts, int *n,
                                   int cap) {
    *n = 0;
    for (int i = 0; i < c->prompts.n; i++) {
        if (*n >= cap) return loom_fail(LOOM_EUSAGE, "more than %d prompts", cap);
        if (!tok) return loom_fail(LOOM_EUSAGE, "--prompt needs --tokenizer DIR (or give --ids)");
        /* the beginning-of-text token first, as Hugging Face's tokenizer(prompt) */
        if (loom_tokenizer_bos(tok) >= 0)
            LOOM_TRY(loom_ids_push(&prompts[*n], (uint32_t)loom_tokenizer_bos(tok)));
        LOOM_TRY(loom_tokenizer_encode(tok, c->prompts.items[i], strlen(c->prompts.items[i]), 1,
                                       &prompts[(*n)++]));
    }
    for (int i = 0; i < c->ids.n; i++) {
        if (*n >= cap) return loom_fail(LOOM_EUSAGE, "more than %d prompts", cap);
        LOOM_TRY(parse_ids("--ids", c->ids.items[i], &prompts[(*n)++]));
    }
    if (c->ids_file[0]) {
        FILE *fp = fopen(c->ids_file, "r");
        if (!fp) return loom_fail(LOOM_ENOINPUT, "--ids-file %s: %s", c->ids_file, strerror(errno));
        char line[65536];
        loom_status st = LOOM_OK;
        while (st == LOOM_OK && fgets(line, sizeof line, fp)) {
            if (strspn(line, " \t\r\n") == strlen(line)) continue;
            if (*n >= cap)
                st = loom_fail(LOOM_EUSAGE, "--ids-file %s: more than %d prompts", c->ids_file, cap);
            else st = parse_ids(c->ids_file, line, &prompts[(*n)++]);
        }
        fclose(fp);
        LOOM_TRY(st);
    }
    if (*n == 0)
        return loom_fail(LOOM_EUSAGE, "no prompt: give --prompt TEXT, --ids LIST or --ids-file FILE");
    return LOOM_OK;
}

static loom_status check_flags(const gen_cfg *c, int world) {
    (void)world; /* the layout is loom_layout_validate's, once the model is known (run) */
    if (!loom_hf_params_path(c->load_params, c->model)[0])
        return loom_fail(LOOM_EUSAGE, "--load-params FILE is required (or --model DIR with its weights)");
    if (c->ep < 1) return loom_fail(LOOM_EUSAGE, "--ep %d: must be >= 1", c->ep); /* also the layout's dp */
    if (c->max_tokens < 1) return loom_fail(LOOM_EUSAGE, "--max-tokens %d: must be >= 1", c->max_tokens);
    if (c->threads < 0) return loom_fail(LOOM_EUSAGE, "--threads %d: must be >= 0 (0 = auto)", c->threads);
    if (c->max_len < 0) return loom_fail(LOOM_EUSAGE, "--max-len %d: must be >= 0", c->max_len);
    if (strcmp(c->format, "text") && strcmp(c->format, "ids") && strcmp(c->format, "jsonl"))
        return loom_fail(LOOM_EUSAGE, "--format %s: one of text, ids, jsonl", c->format);
    loom_sample_opts so = {(float)c->temperature, c->top_k, (float)c->top_p, c->seed};
    return loom_sample_check(&so);
}

static void print_result(const gen_cfg *c, loom_tokenizer *tok, int j, const loom_ids *out) {
    char *text = NULL;
    size_t len = 0;
    if (tok && loom_tokenizer_decode(tok, out->v, out->n, &text, &len) != LOOM_OK) text = NULL;
    if (!strcmp(c->format, "ids")) {
        for (size_t i = 0; i < out->n; i++) printf("%s%u", i ? " " : "", out->v[i]);
        printf("\n");
    } else if (!strcmp(c->format, "jsonl")) {
        cJSON *o = cJSON_CreateObject(), *ids = cJSON_AddArrayToObject(o, "ids");
        cJSON_AddNumberToObject(o, "prompt", j);
        for (size_t i = 0; i < out->n; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(out->v[i]));
        if (text) cJSON_AddStringToObject(o, "text", text);
        char *s = cJSON_PrintUnformatted(o);
        if (s) printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else if (text) {
        fwrite(text, 1, len, stdout);
        printf("\n");
    } else { /* no tokenizer: a byte-level model's ids are bytes; others are shown as <|id|> */
        for (size_t i = 0; i < out->n; i++)
            if (out->v[i] < 256) putchar((int)out->v[i]);
            else printf("<|%u|>", out->v[i]);
        printf("\n");
    }
    free(text);
}

#define MAX_PROMPTS 256

static loom_status run(const gen_cfg *c, loom_device *dev, loom_comm *world) {
    loom_model_config mc;
    loom_tokenizer *tok = NULL;
    loom_ids prompts[MAX_PROMPTS] = {{0}}, outs[MAX_PROMPTS] = {{0}}, stop = {0};
    int n = 0;
    loom_status st = loom_model_config_resolve(c->model, &mc);
    const char *tok_path = loom_hf_tokenizer_path(c->tokenizer, c->model);
    if (st == LOOM_OK && tok_path[0]) st = loom_tokenizer_load(tok_path, &tok);
    if (st == LOOM_OK && tok && loom_tokenizer_vocab_size(tok) > mc.vocab_size)
        st = loom_fail(LOOM_EUSAGE, "tokenizer %s has %d tokens, model %s only vocab_size=%d", tok_path,
                       loom_tokenizer_vocab_size(tok), mc.name, mc.vocab_size);
    if (st == LOOM_OK) st = collect_prompts(c, tok, prompts, &n, MAX_PROMPTS);
    int no_stop = strcmp(c->stop, "none") == 0;
    if (st == LOOM_OK && !no_stop) st = parse_ids("--stop", c->stop, &stop);
    if (st == LOOM_OK && !c->stop[0] && tok && loom_tokenizer_eot(tok) >= 0)
        st = loom_ids_push(&stop, (uint32_t)loom_tokenizer_eot(tok));
    size_t longest = 0;
    for (int j = 0; j < n; j++) longest = prompts[j].n > longest ? prompts[j].n : longest;
    loom_layout l;
    loom_layout_default(&l);
    l.tp = c->tp;
    l.pp = c->pp;
    l.dp = l.ep = c->ep; /* each EP rank holds 1/ep of the experts and runs every prompt */
    const loom_layout_model shape = loom_model_shape(&mc);
    const loom_layout_job job = {.purpose = LOOM_LAYOUT_FOR_INFER, .world = loom_comm_size(world)};
    if (st == LOOM_OK) st = loom_layout_validate(&l, &shape, &job);
    LOOM_TRY(loom_comm_agree(world, st));

    loom_mesh *mesh = NULL;
    loom_infer *inf = NULL;
    int max_len = c->max_len ? c->max_len : mc.n_positions;
    loom_infer_opts io = {
        .dev = dev, .max_seqs = n + (c->check_kv ? 1 : 0), .max_len = max_len, .max_rows = max_len};
    st = loom_mesh_create(world, &l, dev, &mesh);
    if (st == LOOM_OK) st = loom_infer_create(&mc, mesh, &io, &inf);
    st = loom_comm_agree(world, st);
    if (st == LOOM_OK) st = loom_infer_load(inf, loom_hf_params_path(c->load_params, c->model));
    float *logits = NULL;
    const int V = mc.vocab_size;
    if (st == LOOM_OK && c->logits_out[0] && loom_infer_last_stage(inf)) {
        logits = calloc((size_t)n * V, sizeof *logits);
        if (!logits) st = loom_fail(LOOM_EOS, "out of memory for --logits-out");
    }
    st = loom_comm_agree(world, st);
    int coords[LOOM_AXIS_COUNT] = {0};
    coords[LOOM_AXIS_PP] = c->pp - 1;
    const int root = loom_layout_rank(&l, coords);
    loom_gen_opts go = {.max_new = c->max_tokens,
                        .sample = {(float)c->temperature, c->top_k, (float)c->top_p, c->seed},
                        .stop = (const int32_t *)stop.v,
                        .n_stop = (int)stop.n,
                        .prompt_logits = logits,
                        .check_kv = c->check_kv};
    double t0 = loom_comm_wtime();
    if (st == LOOM_OK) st = loom_generate(inf, world, root, n, prompts, &go, outs);
    double secs = loom_comm_wtime() - t0;
    /* the root holds the logits and the KV check; it writes and reports */
    if (st == LOOM_OK && loom_comm_rank(world) == root && logits) {
        FILE *fp = fopen(c->logits_out, "wb");
        if (!fp || fwrite(logits, sizeof(float), (size_t)n * V, fp) != (size_t)n * V)
            st = loom_fail(LOOM_ECANTCREAT, "--logits-out %s: cannot write", c->logits_out);
        if (fp && fclose(fp) != 0 && st == LOOM_OK)
            st = loom_fail(LOOM_EIO, "--logits-out %s: write failed", c->logits_out);
    }
    if (st == LOOM_OK && loom_comm_rank(world) == root && c->check_kv)
        loom_info("kv check: max |cached decode - recomputed prefix| logit difference %.3g", go.kv_max_diff);
    st = loom_comm_agree(world, st);
    if (st == LOOM_OK && loom_comm_rank(world) == 0) {
        size_t total = 0;
        for (int j = 0; j < n; j++) {
            print_result(c, tok, j, &outs[j]);
            total += outs[j].n;
        }
        fflush(stdout);
        loom_info("generated %zu tokens for %d prompt(s) (longest %zu) in %.3f s, tp=%d pp=%d ep=%d", total,
                  n, longest, secs, c->tp, c->pp, c->ep);
    }
    free(logits);
    for (int j = 0; j < MAX_PROMPTS; j++) {
        loom_ids_free(&prompts[j]);
        loom_ids_free(&outs[j]);
    }
    loom_ids_free(&stop);
    loom_infer_free(inf);
    loom_mesh_free(mesh);
    loom_tokenizer_free(tok);
    return st;
}

/* cli_mpi_command's callbacks */
static loom_status check_any(const void *c, int ranks) { return check_flags(c, ranks); }
static loom_status run_any(const void *c, loom_device *dev, loom_comm *world) { return run(c, dev, world); }

int cmd_generate(int argc, char **argv) {
    static gen_cfg c = {.model = "mini",
                        .format = "text",
                        .max_tokens = 64,
                        .top_p = 1.0,
                        .seed = 1,
                        .tp = 1,
                        .pp = 1,
                        .ep = 1};
    static char device[16] = "cpu";
    static cli_opt opts[] = {
        {"model", OPT_STR, c.model, sizeof c.model, "NAME|FILE",
         "built-in model, Hugging Face config.json, or Hugging Face directory (gpt2, llama, mistral, qwen2, mixtral, qwen2_moe) (default mini)"},
        {"load-params", OPT_STR, c.load_params, sizeof c.load_params, "FILE",
         "parameters: safetensors with Hugging Face names, or a Hugging Face directory (default: the --model directory's weights)"},
        {"tokenizer", OPT_STR, c.tokenizer, sizeof c.tokenizer, "DIR",
         "byte-level BPE (DIR or tokenizer.json; GPT-2, Llama 3, Qwen2 kinds) for --prompt and text output; default: the "
         "--model directory's tokenizer.json; text prompts get its BOS first"},
        {"prompt", OPT_STRLIST, &c.prompts, 0, "TEXT",
         "prompt text (repeat for several, generated together)"},
        {"ids", OPT_STRLIST, &c.ids, 0, "LIST", "prompt as token ids \"1,2,3\" (repeat for several)"},
        {"ids-file", OPT_STR, c.ids_file, sizeof c.ids_file, "FILE", "one prompt of token ids per line"},
        {"max-tokens", OPT_INT, &c.max_tokens, 0, "N", "new tokens per prompt at most (default 64)"},
        {"temperature", OPT_DOUBLE, &c.temperature, 0, "T", "0 = greedy (default), else sample at T"},
        {"top-k", OPT_INT, &c.top_k, 0, "K", "sample among the K most likely (default 0 = all)"},
        {"top-p", OPT_DOUBLE, &c.top_p, 0, "P", "sample in the smallest set of mass >= P (default 1)"},
        {"seed", OPT_U64, &c.seed, 0, "S", "sampling seed (default 1)"},
        {"stop", OPT_STR, c.stop, sizeof c.stop, "LIST",
         "stop token ids, or none (default: the tokenizer's end of text, tokenizer_config.json's eos_token)"},
        {"tp", OPT_INT, &c.tp, 0, "N", "tensor-parallel degree (default 1)"},
        {"pp", OPT_INT, &c.pp, 0, "N", "pipeline stages (default 1); tp x pp x ep = ranks"},
        {"ep", OPT_INT, &c.ep, 0, "N",
         "MoE models: experts split over N ranks, each running every prompt (default 1)"},
        {"max-len", OPT_INT, &c.max_len, 0, "N", "KV cache positions per sequence (default n_positions)"},
        {"threads", OPT_INT, &c.threads, 0, "N", "compute threads per rank; 0 = auto"},
        CLI_DEVICE_OPT(device),
        {"format", OPT_STR, c.format, sizeof c.format, "F",
         "text (default; without --tokenizer ids < 256 are bytes, others <|id|>), ids, or jsonl (ids + text)"},
        {"logits-out", OPT_STR, c.logits_out, sizeof c.logits_out, "FILE",
         "write each prompt's last-position logits (float32)"},
        {"check-kv", OPT_FLAG, &c.check_kv, 0, NULL,
         "recompute each sequence in one pass and report the logit difference"},
    };
    static const cli_cmd cmd = {
        "generate",
        "loom generate --load-params FILE [--model NAME|FILE] (--prompt TEXT --tokenizer DIR | --ids LIST | --ids-file FILE) ...",
        "Continue prompts with a KV cache: all prompts are prefilled in one pass, then\n"
        "each unfinished one advances one token per step (greedy, or sampled with\n"
        "--temperature, --top-k, --top-p, --seed) until --max-tokens or a stop token,\n"
        "which is kept. Under mpirun, --tp, --pp and --ep split the model as training does\n"
        "(the same parts and loader); every rank runs the model, rank 0 prints one\n"
        "line per prompt.",
        "example: build/loom generate --model gpt2 --load-params model.safetensors \\\n"
        "           --tokenizer DIR --prompt \"Hello, my name is\" --max-tokens 20\n",
        opts,
        sizeof opts / sizeof opts[0]};
    return cli_mpi_command(argc, argv, &cmd, &c, device, &c.threads, check_any, run_any);
}
