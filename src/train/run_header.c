/* run_header.c - the first row of a run's metrics: what was run (model,
 * layout, batch, optimizer, data, device) and where (versions, MPI, BLAS,
 * host), so a metrics file says how to run it again and what it ran on.
 * Rank 0, local: built with cJSON, written as one line before step 1. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/device.h"
#include "loom/runinfo.h"
#include "train/internal.h"

/* A float setting as the decimal it was given as (3e-4, not 0.000300000014). */
static double fl(float x) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", x);
    double shortest = strtod(buf, NULL);
    for (int p = 1; p <= 9; p++) { /* the fewest digits that are still this float */
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if ((float)strtod(buf, NULL) == x) return strtod(buf, NULL);
    }
    return shortest;
}

void loom_train_model_shape_json(cJSON *m, const loom_model_config *mc) {
    cJSON_AddStringToObject(m, "name", mc->name);
    const int dims[] = {mc->n_layer, mc->n_head, mc->n_embd, mc->vocab_size, mc->n_positions};
    const char *const keys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "n_positions"};
    for (int i = 0; i < 5; i++) cJSON_AddNumberToObject(m, keys[i], dims[i]);
}

static cJSON *model_json(const loom_model_config *mc, size_t n_params) {
    cJSON *m = cJSON_CreateObject();
    loom_train_model_shape_json(m, mc);
    cJSON_AddNumberToObject(m, "params", (double)n_params);
    if (mc->n_expert > 0) {
        cJSON_AddNumberToObject(m, "n_expert", mc->n_expert);
        cJSON_AddNumberToObject(m, "top_k", mc->top_k);
        cJSON_AddNumberToObject(m, "moe_every", mc->moe_every);
        cJSON_AddNumberToObject(m, "capacity_factor", fl(mc->capacity_factor));
    }
    return m;
}

static cJSON *layout_json(const loom_layout *l, int world) {
    cJSON *j = cJSON_CreateObject();
    char order[64] = "";
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        snprintf(order + strlen(order), sizeof order - strlen(order), "%s%s", a ? "," : "",
                 loom_axis_names[l->order[a]]);
    const struct {
        const char *key;
        int value;
    } ints[] = {{"world", world},
                {"dp", l->dp},
                {"tp", l->tp},
                {"pp", l->pp},
                {"cp", l->cp},
                {"ep", l->ep},
                {"zero", l->zero},
                {"micro_batches", loom_layout_micro_batches(l)},
                {"grad_accum", l->grad_accum},
                {"virtual_stages", l->virtual_stages}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        cJSON_AddNumberToObject(j, ints[i].key, ints[i].value);
    cJSON_AddBoolToObject(j, "sp", l->sp);
    cJSON_AddStringToObject(j, "schedule", loom_schedule_names[l->schedule]);
    cJSON_AddStringToObject(j, "cp_impl", loom_cp_impl_names[l->cp_impl]);
    cJSON_AddStringToObject(j, "recompute", loom_recompute_names[l->recompute]);
    cJSON_AddStringToObject(j, "precision", loom_precision_names[l->precision]);
    cJSON_AddStringToObject(j, "comm_precision", loom_precision_names[l->comm_precision]);
    cJSON_AddStringToObject(j, "mesh_order", order);
    return j;
}

static cJSON *run_json(const loom_train_run_state *s) {
    const loom_train_config *c = s->cfg;
    size_t n_params = 0;
    loom_param *table = NULL;
    int n = 0;
    if (loom_param_table_whole(&s->model_cfg, &table, &n, &n_params) == LOOM_OK) free(table);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToObject(r, "model", model_json(&s->model_cfg, n_params));
    cJSON_AddItemToObject(r, "layout", layout_json(&c->layout, s->mesh->world_size));
    const struct {
        const char *key;
        double value;
    } nums[] = {{"batch", c->batch},
                {"seq", c->seq},
                {"steps", c->steps},
                {"start_step", s->start_step},
                {"seed", (double)c->seed},
                {"lr", fl(c->lr)},
                {"warmup", c->warmup},
                {"min_lr_frac", fl(c->min_lr_frac)},
                {"weight_decay", fl(c->weight_decay)},
                {"beta1", fl(c->beta1)},
                {"beta2", fl(c->beta2)},
                {"eps", fl(c->eps)},
                {"grad_clip", fl(c->grad_clip)},
                {"tokens_per_step", (double)c->batch * c->seq},
                {"flops_per_token", s->flops_per_token},
                {"peak_flops", s->peak_flops},
                {"threads", s->dev->threads}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        cJSON_AddNumberToObject(r, nums[i].key, nums[i].value);
    cJSON_AddStringToObject(r, "data", c->data);
    cJSON_AddStringToObject(r, "device", s->dev->be->name);
    cJSON_AddStringToObject(r, "nan_policy", loom_nan_policy_names[c->nan_policy]);
    if (c->load_params[0]) cJSON_AddStringToObject(r, "load_params", c->load_params);
    if (c->resume[0]) cJSON_AddStringToObject(r, "resume", c->resume);
    return r;
}

static cJSON *env_json(void) {
    loom_runinfo ri;
    loom_runinfo_get(&ri);
    cJSON *e = cJSON_CreateObject();
    const char *pairs[][2] = {{"loom", ri.version}, {"commit", ri.commit}, {"compiler", ri.compiler},
                              {"mpi", ri.mpi},      {"blas", ri.blas},     {"bf16_gemm", ri.bf16_gemm},
                              {"cuda", ri.cuda},    {"host", ri.host},     {"cpu", ri.cpu}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        cJSON_AddStringToObject(e, pairs[i][0], pairs[i][1]);
    char when[32];
    time_t t = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    cJSON_AddStringToObject(e, "started", when);
    return e;
}

loom_status loom_report_header(loom_report *r, const loom_train_run_state *s) {
    if (!r->metrics) return LOOM_OK;
    cJSON *h = cJSON_CreateObject();
    cJSON_AddItemToObject(h, "run", run_json(s));
    cJSON_AddItemToObject(h, "env", env_json());
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!text) return loom_fail(LOOM_EOS, "out of memory for the metrics header");
    errno = 0;
    int bad = fputs(text, r->metrics) == EOF || fputc('\n', r->metrics) == EOF || fflush(r->metrics) != 0;
    free(text);
    if (bad)
        return loom_fail(LOOM_EIO, "--metrics %s: write failed: %s", r->cfg->metrics,
                         strerror(errno ? errno : EIO));
    return LOOM_OK;
}
