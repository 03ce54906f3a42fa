/* utf8_tool.c - drive loom's incremental UTF-8 decoder for test_utf8.py.
 *
 *   utf8_tool IN OUT   IN: records [u32 n][n bytes][u32 k][k u32 cut points];
 *                      OUT gets per record [u32 m][m bytes]: the bytes fed to
 *                      loom_utf8_feed in the pieces the cut points make, then
 *                      flushed; and [u32 v]: loom_utf8_valid_len of the bytes.
 * Exit 0 when every output is itself valid UTF-8 by loom_utf8_valid_len. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "loom/tokenizer.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: utf8_tool IN OUT\n");
        return 2;
    }
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    if (!in || !out) return 2;
    uint32_t n, k;
    int bad = 0;
    while (fread(&n, 4, 1, in) == 1) {
        char *b = malloc(n + 1), *o = malloc(3 * ((size_t)n + 1));
        uint32_t *cut = NULL;
        if (!b || !o || fread(b, 1, n, in) != n || fread(&k, 4, 1, in) != 1) return 2;
        cut = malloc(sizeof(uint32_t) * (k + 1));
        if (!cut || fread(cut, 4, k, in) != k) return 2;
        loom_utf8_dec d = {0};
        size_t m = 0, at = 0;
        for (uint32_t i = 0; i <= k; i++) {
            size_t end = i < k ? cut[i] : n;
            m += loom_utf8_feed(&d, b + at, end - at, o + m);
            at = end;
        }
        m += loom_utf8_flush(&d, o + m);
        bad += loom_utf8_valid_len(o, m) != m;
        uint32_t mm = (uint32_t)m, v = (uint32_t)loom_utf8_valid_len(b, n);
        fwrite(&mm, 4, 1, out);
        fwrite(o, 1, m, out);
        fwrite(&v, 4, 1, out);
        free(b);
        free(o);
        free(cut);
    }
    fclose(out);
    return bad ? 1 : 0;
}
