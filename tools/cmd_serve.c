/* cmd_serve.c - `loom serve`: an OpenAI-style completion server on
 * loopback; rank 0 serves HTTP, every rank runs the model (tp x pp). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "loom/comm.h"
#include "loom/hf_dir.h"
#include "loom/infer.h"
#include "loom/kernels.h"
#include "loom/log.h"
#include "loom/mesh.h"
#include "loom/serve.h"
#include "loom/tokenizer.h"

typedef struct serve_cfg {
    char model[1024], load_params[1024], tokenizer[1024], port_file[1024];
    int port, tp, pp, dp, ep, threads, max_seqs, max_len, max_rows, queue, max_body;
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
    return LOOM_OK;
}

static loom_status run(const serve_cfg *c, loom_device *dev, loom_comm *world) {
    loom_model_config mc;
    loom_tokenizer *tok = NULL;
    loom_status st = loom_model_config_resolve(c->model, &mc);
    const char *tok_path = loom_hf_tokenizer_path(c->tokenizer, c->model);
    if (st == LOOM_OK && tok_path[0]) st = loom_tokenizer_load(tok_path, &tok);
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
                                .model_name = mc.name,
                                .port_file = c->port_file[0] ? port_file : NULL};
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
                          .max_body = 1 << 20};
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
        {"threads", OPT_INT, &c.threads, 0, "N", "compute threads per rank; 0 = auto"},
        CLI_DEVICE_OPT(device),
    };
    static const cli_cmd cmd = {
        "serve",
        "loom serve --load-params FILE [--model NAME|FILE] [--tokenizer DIR] [--port P] [--tp N] [--pp N] ...",
        "OpenAI-style completions over HTTP on 127.0.0.1 with continuous batching:\n"
        "  POST /v1/completions {\"prompt\", \"max_tokens\", \"temperature\", \"top_p\", \"top_k\",\n"
        "                        \"seed\", \"stream\"}  (stream: server-sent events)\n"
        "  GET  /health         queue, KV-cache occupancy, TTFT / inter-token p50/p95/p99, tokens/s\n"
        "The KV cache is --max-seqs slots of --max-len positions, allocated at start; a\n"
        "request waits for a slot (at most --queue wait, then 503). Rank 0 serves HTTP,\n"
        "every rank runs the model. With --dp D the job is D independent replicas of\n"
        "tp x pp x ep ranks; replica r serves on port P + r (a load balancer in front spreads\n"
        "requests). SIGINT or SIGTERM stops the server.",
        "example: scripts/loomrun -np 2 build/loom serve --model gpt2 --load-params model.safetensors \\\n"
        "           --tokenizer DIR --tp 2 --port 8000\n"
        "         curl -s localhost:8000/v1/completions -d '{\"prompt\": \"Hello\", \"max_tokens\": 16}'\n",
        opts,
        sizeof opts / sizeof opts[0]};
    return cli_mpi_command(argc, argv, &cmd, &c, device, &c.threads, check_any, run_any);
}
