/* tok_tool.c - drive the BPE tokenizer for the python oracle tests.
 *
 *   tok_tool DIR DOCS OUT   DOCS: records [u32 byte count][bytes]; OUT gets,
 *                           per record, [u32 id count][u32 ids]. Each record
 *                           is also decoded and compared with its bytes
 *                           (unless --no-roundtrip: SentencePiece-style
 *                           decoding puts a space after a special token;
 *                           then the decoded records go to OUT.dec).
 *   Prints "docs N bytes B tokens T roundtrip_mismatches M encode_s S".
 * Exit 0 when every record decodes back exactly, 1 otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 4 && !(argc == 5 && strcmp(argv[4], "--no-roundtrip") == 0)) {
        fprintf(stderr, "usage: tok_tool DIR DOCS OUT [--no-roundtrip]\n");
        return 2;
    }
    loom_tokenizer *tok;
    loom_status st = loom_tokenizer_load(argv[1], &tok);
    if (st != LOOM_OK) {
        fprintf(stderr, "tok_tool: %s\n", loom_errmsg());
        return st;
    }
    FILE *in = fopen(argv[2], "rb"), *out = fopen(argv[3], "wb");
    if (!in || !out) {
        fprintf(stderr, "tok_tool: cannot open %s or %s\n", argv[2], argv[3]);
        return 2;
    }
    FILE *decf = NULL;
    if (argc == 5) {
        static char path[4096];
        snprintf(path, sizeof path, "%s.dec", argv[3]);
        decf = fopen(path, "wb");
        if (!decf) {
            fprintf(stderr, "tok_tool: cannot open %s\n", path);
            return 2;
        }
    }
    size_t docs = 0, bytes = 0, tokens = 0, bad = 0;
    double enc_s = 0;
    uint32_t n;
    char *buf = NULL;
    loom_ids ids = {0};
    while (fread(&n, 4, 1, in) == 1) {
        buf = realloc(buf, n + 1);
        if (fread(buf, 1, n, in) != n) {
            fprintf(stderr, "tok_tool: truncated record %zu\n", docs);
            return 2;
        }
        ids.n = 0;
        double t0 = now();
        st = loom_tokenizer_encode(tok, buf, n, 1, &ids);
        enc_s += now() - t0;
        if (st != LOOM_OK) {
            fprintf(stderr, "tok_tool: %s\n", loom_errmsg());
            return st;
        }
        uint32_t k = (uint32_t)ids.n;
        fwrite(&k, 4, 1, out);
        if (ids.n) fwrite(ids.v, 4, ids.n, out);
        char *dec;
        size_t dl;
        if (loom_tokenizer_decode(tok, ids.v, ids.n, &dec, &dl) != LOOM_OK ||
            (argc == 4 && (dl != n || (n && memcmp(dec, buf, n))))) {
            if (bad < 3) fprintf(stderr, "tok_tool: record %zu does not decode back\n", docs);
            bad++;
        }
        if (decf && dec) {
            uint32_t dn = (uint32_t)dl;
            fwrite(&dn, 4, 1, decf);
            fwrite(dec, 1, dl, decf);
        }
        free(dec);
        docs++;
        bytes += n;
        tokens += ids.n;
    }
    fclose(in);
    if (fclose(out) != 0 || (decf && fclose(decf) != 0)) return 2;
    printf("docs %zu bytes %zu tokens %zu roundtrip_mismatches %zu encode_s %.4f\n", docs, bytes, tokens, bad,
           enc_s);
    loom_ids_free(&ids);
    free(buf);
    loom_tokenizer_free(tok);
    return bad ? 1 : 0;
}
