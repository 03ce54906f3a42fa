/* serve.h - an HTTP completion server over loom_infer with continuous
 * batching.
 *
 * Rank 0 runs the HTTP daemon (libmicrohttpd, its own threads) on loopback:
 *   POST /v1/completions   {"prompt": "text" | [ids], "max_tokens": 16,
 *                           "temperature": 1, "top_p": 1, "top_k": 0,
 *                           "seed": n, "stream": false}
 *                          -> OpenAI-style text_completion JSON, or with
 *                          "stream": true server-sent events, one
 *                          "data: {...}" per token then "data: [DONE]".
 *   GET /health            status, queue, KV-cache occupancy, TTFT and
 *                          per-token latency p50/p95/p99, tokens/s.
 * Bad requests get 4xx with {"error": {"message", "type", "code"}}.
 *
 * The KV cache is planned up front: max_seqs slots of max_len positions.
 * A request needs one slot for prompt + max_tokens <= max_len (else 400);
 * it waits for a free slot in a queue of at most `queue` requests (beyond
 * that: 503). Between model steps rank 0 admits waiting requests and drops
 * finished or disconnected ones: each step runs every running sequence's
 * next token plus prefill chunks of new ones (at most max_rows tokens), so
 * requests join and leave the decode batch between steps.
 *
 * Every rank runs the model: rank 0 sends each step's plan to the others
 * (a small header by point-to-point, polled with sleeps so idle ranks do
 * not spin, then the plan by broadcast), the last stage's tp rank 0 samples
 * and broadcasts the new tokens. SIGINT / SIGTERM on rank 0 shut all ranks
 * down. Collective over world.
 */
#ifndef LOOM_SERVE_H
#define LOOM_SERVE_H

#include "loom/comm.h"
#include "loom/infer.h"
#include "loom/tokenizer.h"

typedef struct loom_serve_config {
    int port;     /* 0: any free port (printed) */
    int queue;    /* waiting requests at most */
    int max_body; /* request body bytes at most */
    const char *model_name;
    const char *port_file; /* if set, rank 0 writes the bound port there */
} loom_serve_config;

/* Runs until rank 0 gets SIGINT or SIGTERM. tok may be NULL (prompts must
 * then be token ids, texts are bytes). root: the sampling rank in world
 * (the job's world, or this replica's group); what it carries is host data
 * (requests, plans, token ids), sent on loom_comm_host(world). LOOM_EUNAVAIL
 * if the port cannot be bound. */
loom_status loom_serve_run(const loom_serve_config *c, loom_infer *inf, loom_tokenizer *tok, loom_comm *world,
                           int root);

#endif
