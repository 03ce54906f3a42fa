/* cmd_serve.c - `loom serve`: an OpenAI-compatible server on loopback;
 * rank 0 serves HTTP, every rank runs the model (tp x pp x ep per replica,
 * --dp replicas). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "loom/chat_template.h"
#include "loom/comm.h"
#include "loom/hf_dir.h"
#include "loom/infer.h"
#include "loom/kernels.h"
#include "loom/log.h"
#include "loom/mesh.h"
#include "loom/serve.h"
#include "loom/tokenizer.h"

typedef struct serve_cfg {
    char model[1024], load_params[1024], tokenizer[1024], port_file[1024], served_name[256],
        chat_template[1024];
    int port, tp, pp, dp, ep, threads, max_seqs, max_len, max_rows, queue, max_body, max_connections,
        no_prefix_cache;
    double read_timeout, drain_timeout;
} serve_cfg;

static loom_status check_flags(const serve_cfg *c, int world) {
    (void)world; /* the layout is loom_layout_validate's, once the model is known (run) */
    if (!loom_hf_params_path(c->load_params, c->model)[0])
        return loom_fail(LOOM_EUSAGE, "--load-params FILE is required (or --model DIR with its weights)");
    if (c->ep < 1 || c->dp < 1) /* both multiply into the layout's dp */
        return loom_fail(LOOM_EUSAGE, "--dp %d and --ep %d must be >= 1", c->dp, c->ep);
    if (c->port < 0 || (long long)c->port + c->dp - 1 > 65535)
        return loom_fail(LOOM_EUSAGE, "--port %d: the ports %d..%lld must be in [0, 65535]", c->port, c->port,
                         (long long)c->port + c->dp - 1);
    if (c->max_seqs < 1 || c->queue < 0 || c->max_body < 64 || c->max_len < 0 || c->max_rows < 0)
        return loom_fail(LOOM_EUSAGE,
                         "--max-seqs %d >= 1, --queue %d >= 0, --max-body %d >= 64, --max-len %d and "
                         "--max-rows %d >= 0 (0 = default)",
                         c->max_seqs, c->queue, c->max_body, c->max_len, c->max_rows);
    if (c->threads < 0) return loom_fail(LOOM_EUSAGE, "--threads %d: must be >= 0 (0 = auto)", c->threads);
    if (c->max_connections < 4 || !(c->read_timeout > 0) || !(c->drain_timeout >= 0))
        return loom_fail(LOOM_EUSAGE,
                         "--max-connections %d >= 4, --read-timeout %g > 0 and --drain-timeout %g >= 0",
                         c->max_connections, c->read_timeout, c->drain_timeout);
    return LOOM_OK;
}

/* The id /v1/models shows: --served-model-name, else the built-in model's
 * name, else the config file's directory (or its name without .json). */
static void served_name(const serve_cfg *c, const loom_model_config *mc, char *out, size_t cap) {
    if (c->served_name[0]) {
        snprintf(out, cap, "%s", c->served_name);
        return;
    }
    const char *slash = strrchr(c->model, '/');
    if (!strchr(c->model, '/') && !strstr(c->model, ".json")) {
        snprintf(out, cap, "%s", mc->name);
    } else if (slash && strcmp(slash + 1, "config.json") == 0 && slash > c->model) {
        const char *d = slash;
        while (d > c->model && d[-1] != '/') d--;
        snprintf(out, cap, "%.*s", (int)(slash - d), d);
    } else {
        const char *b = slash ? slash + 1 : c->model;
        size_t n = strlen(b);
        if (n > 5 && strcmp(b + n - 5, ".json") == 0) n -= 5;
        snprintf(out, cap, "%.*s", (int)n, b);
    }
    if (!out[0] || strcmp(out, ".") == 0) snprintf(out, cap, "%s", mc->name);
}

/* The chat template: --chat-template FILE, else the tokenizer directory's
 * tokenizer_config.json (--tokenizer's, or --model DIR's), else ChatML; with its bos/eos tokens. */
static loom_status load_chat(const serve_cfg *c, const char *tok_path, loom_chat_template **t, char **bos,
                             char **eos) {
    char *src = NULL;
    *bos = *eos = NULL;
    if (tok_path[0]) { /* a tokenizer directory, or the directory of a tokenizer.json */
        char dir[4096];
        struct stat sb;
        snprintf(dir, sizeof dir, "%s", tok_path);
        char *slash = strrchr(dir, '/');
        if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) {
            if (slash) *slash = '\0';
            else snprintf(dir, sizeof dir, ".");
        }
        LOOM_TRY(loom_chat_config_load(dir, &src, bos, eos));
    }
    if (c->chat_template[0]) {
        free(src);
        src = NULL;
        FILE *f = fopen(c->chat_template, "rb");
        long n = -1;
        if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
        if (n >= 0 && (src = malloc((size_t)n + 1)) && fseek(f, 0, SEEK_SET) == 0 &&
            fread(src, 1, (size_t)n, f) == (size_t)n)
            src[n] = '\0';
        else {
            free(src);
            src = NULL;
        }
        if (f) fclose(f);
        if (!src) return loom_fail(LOOM_ENOINPUT, "--chat-template %s: cannot read it", c->chat_template);
    }
    const char *use = src ? src : LOOM_CHAT_TEMPLATE_CHATML;
    loom_status st = loom_chat_template_parse(use, strlen(use), t);
    if (st == LOOM_OK)
        loom_info("chat template: %s", c->chat_template[0] ? c->chat_template
                                       : src               ? "the tokenizer's (tokenizer_config.json)"
                                                           : "ChatML (the tokenizer has none)");
    free(src);
    return st;
}

static loom_status run(const serve_cfg *c, loom_device *dev, loom_comm *world) {
    loom_model_config mc;
    loom_tokenizer *tok = NULL;
    loom_chat_template *chat = NULL;
    char *bos = NULL, *eos = NULL, name[256];
    loom_status st = loom_model_config_resolve(c->model, &mc);
    const char *tok_path = loom_hf_tokenizer_path(c->tokenizer, c->model);
    if (st == LOOM_OK && tok_path[0]) st = loom_tokenizer_load(tok_path, &tok);
    if (st == LOOM_OK) st = load_chat(c, tok_path, &chat, &bos, &eos);
    if (st == LOOM_OK && tok && !eos &&
        loom_tokenizer_eot(tok) >= 0) { /* GPT-2: <|endoftext|> ends and begins */
        size_t n;
        const char *b = loom_tokenizer_token_bytes(tok, (uint32_t)loom_tokenizer_eot(tok), &n);
        eos = strndup(b, n);
        bos = bos ? bos : strndup(b, n);
    }
    if (st == LOOM_OK) served_name(c, &mc, name, sizeof name);
    if (st == LOOM_OK && tok && loom_tokenizer_vocab_size(tok) > mc.vocab_size)
        st = loom_fail(LOOM_EUSAGE, "tokenizer %s has %d tokens, model %s only vocab_size=%d", tok_path,
                       loom_tokenizer_vocab_size(tok), mc.name, mc.vocab_size);
    loom_layout l;
    loom_layout_default(&l);
    l.tp = c->tp;
    l.pp = c->pp;
    l.dp = c->dp * c->ep; /* a replica's ep ranks are consecutive dp ranks: one EP group */
    l.ep = c->ep;
    const loom_layout_model shape = loom_model_shape(&mc);
    const loom_layout_job job = {.purpose = LOOM_LAYOUT_FOR_INFER, .world = loom_comm_size(world)};
    if (st == LOOM_OK) st = loom_layout_validate(&l, &shape, &job);
    st = loom_comm_agree(world, st);
    loom_mesh *mesh = NULL;
    loom_comm *replica = NULL; /* this rank's replica: a tp x pp x ep group with its own server */
    loom_infer *inf = NULL;
    int max_len = c->max_len ? c->max_len : mc.n_positions;
    int max_rows = c->max_rows ? c->max_rows : max_len + c->max_seqs;
    loom_infer_opts io = {.dev = dev, .max_seqs = c->max_seqs, .max_len = max_len, .max_rows = max_rows};
    if (st == LOOM_OK) st = loom_mesh_create(world, &l, dev, &mesh);
    if (st == LOOM_OK) st = loom_infer_create(&mc, mesh, &io, &inf);
    if (st == LOOM_OK || mesh) st = loom_comm_agree(world, st);
    if (st == LOOM_OK) st = loom_infer_load(inf, loom_hf_params_path(c->load_params, c->model));
    const int r = st == LOOM_OK ? mesh->dp_rank / c->ep : 0; /* this rank's replica */
    if (st == LOOM_OK && c->dp > 1) /* the device's group, as the mesh's (device.h) */
        st = loom_device_comm_split(dev, world, r, loom_comm_rank(world), "replica", &replica);
    if (st == LOOM_OK) {
        /* ranks of a replica in world order are its (dp = ep) layout's ranks */
        loom_layout one = l;
        one.dp = c->ep;
        int coords[LOOM_AXIS_COUNT] = {0};
        coords[LOOM_AXIS_PP] = c->pp - 1;
        char port_file[1100];
        snprintf(port_file, sizeof port_file, r ? "%s.%d" : "%s", c->port_file, r);
        loom_serve_config sc = {.port = c->port ? c->port + r : 0,
                                .queue = c->queue,
                                .max_body = c->max_body,
                                .max_connections = c->max_connections,
                                .read_timeout = c->read_timeout,
                                .drain_timeout = c->drain_timeout,
                                .prefix_cache = !c->no_prefix_cache,
                                .model_name = name,
                                .port_file = c->port_file[0] ? port_file : NULL,
                                .chat_template = chat,
                                .bos_token = bos,
                                .eos_token = eos};
        if (c->dp > 1)
            loom_info("%d replicas of tp=%d x pp=%d x ep=%d ranks; replica r serves on %s", c->dp, c->tp,
                      c->pp, c->ep,
                      c->port ? "port --port + r" : "its own free port (--port-file FILE, FILE.r)");
        st = loom_serve_run(&sc, inf, tok, replica ? replica : world, loom_layout_rank(&one, coords));
    }
    loom_comm_free(replica);
    loom_infer_free(inf);
    loom_mesh_free(mesh);
    loom_tokenizer_free(tok);
    loom_chat_template_free(chat);
    free(bos);
    free(eos);
    return st;
}

/* cli_mpi_command's callbacks */
static loom_status check_any(const void *c, int ranks) { return check_flags(c, ranks); }
static loom_status run_any(const void *c, loom_device *dev, loom_comm *world) { return run(c, dev, world); }

int cmd_serve(int argc, char **argv) {
    static serve_cfg c = {.model = "mini",
                          .port = 8000,
                          .tp = 1,
                          .pp = 1,
                          .dp = 1,
                          .ep = 1,
                          .max_seqs = 8,
                          .queue = 64,
                          .max_body = 1 << 20,
                          .max_connections = 512,
                          .read_timeout = 10,
                          .drain_timeout = 30};
    static char device[16] = "cpu";
    static cli_opt opts[] = {
        {"model", OPT_STR, c.model, sizeof c.model, "NAME|FILE",
         "built-in model, Hugging Face config.json, or Hugging Face directory (gpt2, llama, mistral, qwen2, mixtral, qwen2_moe) (default mini)"},
        {"load-params", OPT_STR, c.load_params, sizeof c.load_params, "FILE",
         "parameters: safetensors with Hugging Face names, or a Hugging Face directory (default: the --model directory's weights)"},
        {"tokenizer", OPT_STR, c.tokenizer, sizeof c.tokenizer, "DIR",
         "byte-level BPE (DIR or tokenizer.json; GPT-2, Llama 3, Qwen2 kinds) for text prompts (without: bytes or id arrays); default: the "
         "--model directory's tokenizer.json; text prompts get its BOS first"},
        {"port", OPT_INT, &c.port, 0, "P", "TCP port on 127.0.0.1 (default 8000; 0 = any free port)"},
        {"port-file", OPT_STR, c.port_file, sizeof c.port_file, "FILE",
         "write the bound port there (replica r > 0: FILE.r)"},
        {"tp", OPT_INT, &c.tp, 0, "N", "tensor-parallel degree (default 1)"},
        {"pp", OPT_INT, &c.pp, 0, "N", "pipeline stages (default 1)"},
        {"dp", OPT_INT, &c.dp, 0, "N", "replicas, each tp x pp x ep ranks with its own port P+r (default 1)"},
        {"ep", OPT_INT, &c.ep, 0, "N",
         "MoE models: experts split over N ranks of each replica, each running every request (default 1)"},
        {"max-seqs", OPT_INT, &c.max_seqs, 0, "N", "KV-cache slots: requests decoding at once (default 8)"},
        {"max-len", OPT_INT, &c.max_len, 0, "N",
         "positions per slot, prompt + max_tokens (default n_positions)"},
        {"max-rows", OPT_INT, &c.max_rows, 0, "N", "tokens per model step (default max-len + max-seqs)"},
        {"queue", OPT_INT, &c.queue, 0, "N",
         "requests waiting for a slot at most; more get 503 (default 64)"},
        {"max-body", OPT_INT, &c.max_body, 0, "BYTES", "request body size limit (default 1048576)"},
        {"max-connections", OPT_INT, &c.max_connections, 0, "N",
         "open HTTP connections at most (default 512)"},
        {"read-timeout", OPT_DOUBLE, &c.read_timeout, 0, "S",
         "a connection must send a whole request within S seconds (default 10)"},
        {"drain-timeout", OPT_DOUBLE, &c.drain_timeout, 0, "S",
         "after SIGTERM/SIGINT, running requests get S seconds, then end with finish_reason abort (default 30)"},
        {"no-prefix-cache", OPT_FLAG, &c.no_prefix_cache, 0, NULL,
         "compute every prompt in full (default: a new sequence copies the longest prefix of its prompt that a "
         "cached sequence holds)"},
        {"served-model-name", OPT_STR, c.served_name, sizeof c.served_name, "NAME",
         "the model id of /v1/models and requests (default: the model's name or directory)"},
        {"chat-template", OPT_STR, c.chat_template, sizeof c.chat_template, "FILE",
         "Jinja chat template (default: the tokenizer's tokenizer_config.json, else ChatML)"},
        {"threads", OPT_INT, &c.threads, 0, "N", "compute threads per rank; 0 = auto"},
        CLI_DEVICE_OPT(device),
    };
    static const cli_cmd cmd = {
        "serve",
        "loom serve --load-params FILE [--model NAME|FILE] [--tokenizer DIR] [--port P] [--tp N] [--pp N] ...",
        "The OpenAI API over HTTP on 127.0.0.1 with continuous batching:\n"
        "  POST /v1/completions       prompt (text, ids, or a list), max_tokens, temperature, top_p,\n"
        "                             top_k, n, stop, stop_token_ids, logprobs, echo, presence_penalty,\n"
        "                             frequency_penalty, seed, stream, stream_options.include_usage\n"
        "  POST /v1/chat/completions  messages through the chat template; the same options, logprobs +\n"
        "                             top_logprobs, max_completion_tokens\n"
        "  GET  /v1/models            the served model (--served-model-name); another name gets 404\n"
        "  GET  /health, /metrics     queue, KV cache, TTFT / inter-token latency, tokens/s (JSON;\n"
        "                             Prometheus text)\n"
        "Unsupported fields get a 400 naming them. SIGINT or SIGTERM drain: no new requests,\n"
        "running ones finish (at most --drain-timeout s), every stream gets its final event and\n"
        "[DONE], then every rank exits 0.\n"
        "The KV cache is --max-seqs slots of --max-len positions, allocated at start; each\n"
        "choice of a request takes a slot (at most --queue wait, then 503) and starts from the\n"
        "longest prefix of its prompt another slot has cached (copied, not recomputed). Rank 0 serves HTTP,\n"
        "every rank runs the model. With --dp D the job is D independent replicas of\n"
        "tp x pp x ep ranks; replica r serves on port P + r (a load balancer in front spreads\n"
        "requests).",
        "example: scripts/loomrun -np 2 build/loom serve --model gpt2 --load-params model.safetensors \\\n"
        "           --tokenizer DIR --tp 2 --port 8000\n"
        "         curl -s localhost:8000/v1/completions -d '{\"prompt\": \"Hello\", \"max_tokens\": 16}'\n",
        opts,
        sizeof opts / sizeof opts[0]};
    return cli_mpi_command(argc, argv, &cmd, &c, device, &c.threads, check_any, run_any);
}
