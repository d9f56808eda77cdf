/* serve_text.c: incremental decoding, stop strings and UTF-8 repair for `sparkmono serve`
 * (see serve_text.h).  The stop-string scan is a plain memmem over the held-back text plus
 * the new piece, which is a few bytes a step; we rejected Aho-Corasick for at most four
 * short patterns. */
#include "serve/serve_text.h"
#include <stdlib.h>
#include <string.h>

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD in UTF-8 */

/* Length of the valid UTF-8 character at s [n] (1..4), 0 when invalid, -1 when s is a valid
 * start cut short by the end of the buffer.  Overlong forms, surrogates and code points above
 * U+10FFFF are invalid (RFC 3629). */
static int utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int len;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) len = 2;
    else if (c < 0xF0) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c < 0xF5) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -1;
        unsigned x = s[i];
        if (i == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return 0;
    }
    return len;
}

int sm_utf8_sanitize(sm_buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of the valid bytes not yet copied */
    while (i < n) {
        int k = utf8_char(u + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (sm_buf_add(b, s + run, i - run) || sm_buf_add(b, REPLACEMENT, 3)) return -1;
        i++;
        run = i;
    }
    return sm_buf_add(b, s + run, n - run);
}

size_t sm_utf8_complete(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    /* a cut character starts at most 3 bytes before the end */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned c = u[n - back];
        if (c < 0x80) return n;            /* ASCII: nothing is cut */
        if (c >= 0xC0) /* a lead byte: cut when it needs more bytes than there are */
            return utf8_char(u + n - back, back) == -1 ? n - back : n;
    }
    return n;
}

/* Append the text of ids [n] to b, special tokens left out unless keep_special (an eos id ends
 * the text, it is not part of it: the `tokenizers` library's skip_special_tokens); an id the
 * tokenizer refuses becomes U+FFFD. */
static int decode_into(const sm_tokenizer *t, const int *ids, int n, int keep_special, sm_buf *b) {
    int *keep = malloc((size_t)n * sizeof(int)), k = 0;
    if (!keep) return -1;
    for (int i = 0; i < n; i++)
        if (keep_special || !sm_tokenizer_is_special(t, ids[i])) keep[k++] = ids[i];
    char *txt = NULL;
    size_t len = 0;
    sm_err e = {{0}};
    int rc = 0;
    if (k == 0) {
        /* nothing but special tokens */
    } else if (sm_tokenizer_decode(t, keep, k, &txt, &len, &e) == 0) {
        rc = sm_buf_add(b, txt, len);
        free(txt);
    } else if (k == 1) {
        rc = sm_buf_add(b, REPLACEMENT, 3);
    } else {
        for (int i = 0; i < k && !rc; i++) rc = decode_into(t, keep + i, 1, 1, b); /* find the bad ids one by one */
    }
    free(keep);
    return rc;
}

/* Length of the longest suffix of s [n] that is a proper prefix of one of the stop strings. */
static size_t stop_prefix_tail(const sm_detok *d, const char *s, size_t n) {
    size_t best = 0;
    for (int j = 0; j < d->nstop; j++) {
        size_t ls = d->stop_len[j];
        for (size_t k = ls - 1 < n ? ls - 1 : n; k > best; k--)
            if (memcmp(s + n - k, d->stop[j], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

int sm_detok_push(sm_detok *d, const int *ids, int n, int final, sm_buf *out, sm_err *e) {
    if (!d->tok) return 0;
    if (n > d->w0) {
        sm_buf w = {0};
        if (decode_into(d->tok, ids + d->w0, n - d->w0, d->keep_special, &w)) {
            sm_buf_free(&w);
            return sm_errf(e, "serve: out of memory decoding text");
        }
        size_t done = final ? w.n : sm_utf8_complete(w.p, w.n);
        /* the tokenizer writes U+FFFD for bytes that are not a whole character: one at the very
         * end may be a character cut between two tokens, so it waits for the next token (the
         * window is decoded again, whole, with it) */
        if (!final && done == w.n && done >= 3 && !memcmp(w.p + done - 3, REPLACEMENT, 3)) done -= 3;
        if (done > d->wb && sm_buf_add(&d->pend, w.p + d->wb, done - d->wb)) {
            sm_buf_free(&w);
            return sm_errf(e, "serve: out of memory decoding text");
        }
        if (done > d->wb) d->wb = done;
        if (d->wb == w.n) { /* the window is out: start a new one */
            d->w0 = n;
            d->wb = 0;
        }
        sm_buf_free(&w);
    }
    if (!d->pend.n) return 0;
    /* the earliest stop string in the held-back text ends the output (before it, or after it) */
    const char *hit = NULL;
    size_t hit_len = 0;
    for (int j = 0; j < d->nstop; j++) {
        const char *p = memmem(d->pend.p, d->pend.n, d->stop[j], d->stop_len[j]);
        if (p && (!hit || p < hit)) hit = p, hit_len = d->stop_len[j];
    }
    size_t give = hit ? (size_t)(hit - d->pend.p) + (d->include_stop ? hit_len : 0)
                      : d->pend.n - (final ? 0 : stop_prefix_tail(d, d->pend.p, d->pend.n));
    if (sm_utf8_sanitize(out, d->pend.p, give)) return sm_errf(e, "serve: out of memory for the output text");
    if (hit) {
        d->pend.n = 0;
        return 1;
    }
    memmove(d->pend.p, d->pend.p + give, d->pend.n - give);
    d->pend.n -= give;
    d->pend.p[d->pend.n] = 0;
    return 0;
}

void sm_detok_free(sm_detok *d) { sm_buf_free(&d->pend); }
