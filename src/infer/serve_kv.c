/* serve_kv.c - the paged KV cache's blocks on rank 0 of `loom serve`: a
 * pool of n_blocks blocks of bs positions, each with a reference count (the
 * sequences whose block table holds it); a block table per slot; prefix
 * caching by block: a full block is registered under the hash of its
 * tokens and of its parent block's hash (so a hash names a whole prefix),
 * and a new sequence whose prompt starts with registered blocks takes them
 * by reference instead of computing them. Blocks no sequence holds sit on
 * one free list: never-registered ones at its head, registered ones (still
 * findable) appended as they are released, so an allocation takes an empty
 * block first and else evicts the least recently released cached one.
 * Host bookkeeping only: the model loop sends the tables to every rank
 * (serve.c). */
#include <stdlib.h>
#include <string.h>

#include "infer/serve_internal.h"

static uint64_t mix(uint64_t h, uint64_t x) { /* splitmix64 of h ^ x */
    h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

uint64_t kv_block_hash(uint64_t parent, const uint32_t *toks, int bs) {
    uint64_t h = mix(0x6b76626c6f636bULL, parent);
    for (int i = 0; i < bs; i++) h = mix(h, toks[i]);
    return h ? h : 1; /* 0: no parent */
}

int kv_pool_init(kv_pool *p, int n_blocks, int bs, int max_seqs, int max_blocks) {
    memset(p, 0, sizeof *p);
    p->n_blocks = n_blocks, p->bs = bs, p->max_seqs = max_seqs, p->max_blocks = max_blocks;
    p->n_bucket = 1;
    while (p->n_bucket < 2 * n_blocks) p->n_bucket *= 2;
    p->ref = calloc((size_t)n_blocks, sizeof *p->ref);
    p->hash = calloc((size_t)n_blocks, sizeof *p->hash);
    p->parent = calloc((size_t)n_blocks, sizeof *p->parent);
    p->toks = calloc((size_t)n_blocks * bs, sizeof *p->toks);
    p->in_table = calloc((size_t)n_blocks, sizeof *p->in_table);
    p->prev = malloc(sizeof *p->prev * (size_t)n_blocks);
    p->next = malloc(sizeof *p->next * (size_t)n_blocks);
    p->chain = malloc(sizeof *p->chain * (size_t)n_blocks);
    p->bucket = malloc(sizeof *p->bucket * (size_t)p->n_bucket);
    p->table = calloc((size_t)max_seqs * max_blocks, sizeof *p->table);
    p->nb = calloc((size_t)max_seqs, sizeof *p->nb);
    p->n_reg = calloc((size_t)max_seqs, sizeof *p->n_reg);
    if (!p->ref || !p->hash || !p->parent || !p->toks || !p->in_table || !p->prev || !p->next || !p->chain ||
        !p->bucket || !p->table || !p->nb || !p->n_reg)
        return 0;
    for (int i = 0; i < p->n_bucket; i++) p->bucket[i] = -1;
    p->head = p->tail = -1;
    for (int b = n_blocks - 1; b >= 0; b--) { /* every block empty and free, 0 first */
        p->prev[b] = -1, p->next[b] = p->head;
        if (p->head >= 0) p->prev[p->head] = b;
        else p->tail = b;
        p->head = b;
    }
    p->n_free = n_blocks;
    return 1;
}

void kv_pool_free(kv_pool *p) {
    free(p->ref), free(p->hash), free(p->parent), free(p->toks), free(p->in_table), free(p->prev);
    free(p->next), free(p->chain), free(p->bucket), free(p->table), free(p->nb), free(p->n_reg);
    memset(p, 0, sizeof *p);
}

static void unlink_free(kv_pool *p, int b) {
    if (p->prev[b] >= 0) p->next[p->prev[b]] = p->next[b];
    else p->head = p->next[b];
    if (p->next[b] >= 0) p->prev[p->next[b]] = p->prev[b];
    else p->tail = p->prev[b];
    p->n_free--;
}

static void unregister(kv_pool *p, int b) {
    int *at = &p->bucket[p->hash[b] & (uint64_t)(p->n_bucket - 1)];
    while (*at != b) at = &p->chain[*at];
    *at = p->chain[b];
    p->in_table[b] = 0;
    p->n_cached--;
}

int kv_pool_alloc(kv_pool *p) {
    const int b = p->head;
    if (b < 0) return -1;
    unlink_free(p, b);
    if (p->in_table[b]) {
        unregister(p, b);
        p->evictions++;
    }
    p->hash[b] = 0;
    p->ref[b] = 1;
    return b;
}

void kv_pool_ref(kv_pool *p, int b) {
    if (p->ref[b]++ == 0) unlink_free(p, b);
}

void kv_pool_release(kv_pool *p, int b) {
    if (--p->ref[b] > 0) return;
    if (p->in_table[b]) { /* findable: the end of the list, evicted last */
        p->next[b] = -1, p->prev[b] = p->tail;
        if (p->tail >= 0) p->next[p->tail] = b;
        else p->head = b;
        p->tail = b;
    } else { /* empty: taken first */
        p->prev[b] = -1, p->next[b] = p->head;
        if (p->head >= 0) p->prev[p->head] = b;
        else p->tail = b;
        p->head = b;
    }
    p->n_free++;
}

int kv_pool_lookup(const kv_pool *p, uint64_t parent, const uint32_t *toks) {
    const uint64_t h = kv_block_hash(parent, toks, p->bs);
    for (int b = p->bucket[h & (uint64_t)(p->n_bucket - 1)]; b >= 0; b = p->chain[b])
        if (p->hash[b] == h && p->parent[b] == parent &&
            !memcmp(p->toks + (size_t)b * p->bs, toks, sizeof *toks * (size_t)p->bs))
            return b;
    return -1;
}

void kv_pool_register(kv_pool *p, int b, uint64_t parent, const uint32_t *toks) {
    p->hash[b] = kv_block_hash(parent, toks, p->bs);
    p->parent[b] = parent;
    if (p->in_table[b] || kv_pool_lookup(p, parent, toks) >= 0)
        return; /* the same block is findable already */
    memcpy(p->toks + (size_t)b * p->bs, toks, sizeof *toks * (size_t)p->bs);
    const size_t at = p->hash[b] & (uint64_t)(p->n_bucket - 1);
    p->chain[b] = p->bucket[at];
    p->bucket[at] = b;
    p->in_table[b] = 1;
    p->n_cached++;
}

void kv_pool_drop_seq(kv_pool *p, int s) {
    int32_t *t = p->table + (size_t)s * p->max_blocks;
    for (int i = 0; i < p->nb[s]; i++) kv_pool_release(p, t[i]);
    p->nb[s] = p->n_reg[s] = 0;
}

int kv_pool_used(const kv_pool *p) { return p->n_blocks - p->n_free; }
