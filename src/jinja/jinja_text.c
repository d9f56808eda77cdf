/* jinja_text.c: strings as Python's str has them, for the Jinja renderer (see jinja_int.h):
 * code points of UTF-8 text, whitespace and line breaks, and case: lower(), upper(), title(),
 * capitalize(), swapcase() with the full Unicode mappings ('ß'.upper() is 'SS', 'İ'.lower() is
 * 'i̇') and the final-sigma rule of lower() ('ΟΔΟΣ'.lower() is 'οδος'), and islower() /
 * isupper() / istitle() / isalpha() / isdigit() / isalnum() / isspace().
 *
 * utf8proc gives the simple one-to-one mappings and the general categories; the few facts it
 * lacks (the one-to-many mappings of SpecialCasing, the Lowercase / Uppercase characters
 * outside Ll / Lu, the case-ignorable characters outside Mn Me Cf Lm Sk, the digits outside Nd)
 * are small tables in jinja_unidata.h, generated from Python's own str methods by
 * tests/jinja/unidata_gen.py.  We rejected ASCII-only case mapping (the renderer's first form:
 * 'Ä'|lower stayed 'Ä') and a full Unicode database of our own (utf8proc is a well-kept one).
 */
#include "jinja/jinja_int.h"
#include "jinja/jinja_unidata.h"
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

uint32_t ju_next(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) { /* not UTF-8: the byte stands for itself */
        return (unsigned char)s[(*i)++];
    }
    *i += (size_t)k;
    return (uint32_t)cp;
}

int ju_put(sm_buf *b, uint32_t cp) {
    utf8proc_uint8_t u[4];
    utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)cp, u);
    return sm_buf_add(b, u, (size_t)k);
}

size_t ju_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; k++) ju_next(s, n, &i);
    return k;
}

int ju_offsets(const char *s, size_t n, size_t **offs, size_t *count) {
    size_t *o = malloc(sizeof *o * (n + 1)), k = 0;
    if (!o) return -1;
    for (size_t i = 0; i < n;) {
        o[k++] = i;
        ju_next(s, n, &i);
    }
    o[k] = n; /* the end, one past the last code point */
    *offs = o;
    *count = k;
    return 0;
}

json_t *ju_chars(const char *s, size_t n) {
    json_t *l = json_array();
    for (size_t i = 0, k; l && i < n; i = k) {
        k = i;
        ju_next(s, n, &k);
        if (json_array_append_new(l, json_stringn_nocheck(s + i, k - i))) {
            json_decref(l);
            return NULL;
        }
    }
    return l;
}

/* cp in one of the sorted range tables r [n]. */
static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) { /* binary search */
        size_t m = (lo + hi) / 2;
        if (cp < r[m][0]) hi = m;
        else if (cp > r[m][1]) lo = m + 1;
        else return 1;
    }
    return 0;
}
#define IN(t, cp) in_ranges(t, sizeof t / sizeof t[0], cp)

int ju_isspace(uint32_t cp) { return IN(JU_SPACE, cp); }

int ju_isprintable(uint32_t cp) {
    if (cp == ' ') return 1;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default: return 1;
    }
}

int ju_islinebreak(uint32_t cp) {
    return (cp >= '\n' && cp <= '\r') || (cp >= 0x1c && cp <= 0x1e) || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

static int cat(uint32_t cp) { return utf8proc_category((utf8proc_int32_t)cp); }
static int is_lower(uint32_t cp) { return cat(cp) == UTF8PROC_CATEGORY_LL || IN(JU_OTHER_LOWER, cp); }
static int is_upper(uint32_t cp) { return cat(cp) == UTF8PROC_CATEGORY_LU || IN(JU_OTHER_UPPER, cp); }
static int is_title(uint32_t cp) { return cat(cp) == UTF8PROC_CATEGORY_LT; }
static int is_cased(uint32_t cp) { return is_lower(cp) || is_upper(cp) || is_title(cp); }
static int is_ignorable(uint32_t cp) {
    int k = cat(cp);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_ME || k == UTF8PROC_CATEGORY_CF ||
           k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_SK || IN(JU_IGNORABLE, cp);
}
static int is_alpha(uint32_t cp) { return cat(cp) >= UTF8PROC_CATEGORY_LU && cat(cp) <= UTF8PROC_CATEGORY_LO; }
static int is_digit(uint32_t cp) { return cat(cp) == UTF8PROC_CATEGORY_ND || IN(JU_DIGIT, cp); }

static const ju_special *special(uint32_t cp) {
    size_t lo = 0, hi = sizeof JU_SPECIAL / sizeof JU_SPECIAL[0];
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (cp < JU_SPECIAL[m].cp) hi = m;
        else if (cp > JU_SPECIAL[m].cp) lo = m + 1;
        else return &JU_SPECIAL[m];
    }
    return NULL;
}

/* cp's full mapping (JU_LOWER, JU_UPPER or JU_TITLE) appended to b. */
static int put_full(sm_buf *b, uint32_t cp, int mode) {
    const ju_special *sp = special(cp);
    if (sp) {
        const uint32_t *m = mode == JU_LOWER ? sp->lower : mode == JU_UPPER ? sp->upper : sp->title;
        for (int k = 0; k < 3 && m[k]; k++)
            if (ju_put(b, m[k])) return -1;
        return 0;
    }
    utf8proc_int32_t c = (utf8proc_int32_t)cp;
    return ju_put(b, (uint32_t)(mode == JU_LOWER ? utf8proc_tolower(c) : mode == JU_UPPER ? utf8proc_toupper(c) : utf8proc_totitle(c)));
}

/* The lower case of the code point cps[i] of a string [n]: capital sigma becomes final sigma
 * after a cased letter and not before one (case-ignorable characters skipped both ways). */
static int put_lower(sm_buf *b, const uint32_t *cps, size_t n, size_t i) {
    if (cps[i] != 0x3A3) return put_full(b, cps[i], JU_LOWER);
    size_t j = i;
    while (j > 0 && is_ignorable(cps[j - 1])) j--;
    int final = j > 0 && is_cased(cps[j - 1]);
    if (final) {
        for (j = i + 1; j < n && is_ignorable(cps[j]); j++) {}
        final = j == n || !is_cased(cps[j]);
    }
    return ju_put(b, final ? 0x3C2 : 0x3C3);
}

int ju_case(const char *s, size_t n, int mode, sm_buf *out) {
    uint32_t *cps = malloc(sizeof *cps * (n + 1));
    if (!cps) return -1;
    size_t m = 0;
    for (size_t i = 0; i < n;) cps[m++] = ju_next(s, n, &i);
    int rc = 0, prev_cased = 0;
    for (size_t i = 0; i < m && !rc; i++) {
        uint32_t c = cps[i];
        switch (mode) {
        case JU_LOWER: rc = put_lower(out, cps, m, i); break;
        case JU_UPPER: rc = put_full(out, c, JU_UPPER); break;
        case JU_CAPITALIZE: rc = i ? put_lower(out, cps, m, i) : put_full(out, c, JU_TITLE); break;
        case JU_TITLE: /* title case after an uncased character, lower case after a cased one */
            rc = prev_cased ? put_lower(out, cps, m, i) : put_full(out, c, JU_TITLE);
            prev_cased = is_cased(c);
            break;
        case JU_SWAPCASE:
            rc = is_upper(c) ? put_lower(out, cps, m, i) : is_lower(c) ? put_full(out, c, JU_UPPER) : ju_put(out, c);
            break;
        default: rc = -1;
        }
    }
    free(cps);
    return rc;
}

int ju_is(const char *s, size_t n, int what) {
    int cased = 0, prev = 0;
    if (!n) return 0;
    for (size_t i = 0; i < n;) {
        uint32_t c = ju_next(s, n, &i);
        switch (what) {
        case JU_ISLOWER: /* no upper or title case, some lower case */
            if (is_upper(c) || is_title(c)) return 0;
            cased |= is_lower(c);
            break;
        case JU_ISUPPER:
            if (is_lower(c) || is_title(c)) return 0;
            cased |= is_upper(c);
            break;
        case JU_ISTITLE: /* upper / title case only after uncased, lower case only after cased */
            if (is_upper(c) || is_title(c)) {
                if (prev) return 0;
                prev = cased = 1;
            } else if (is_lower(c)) {
                if (!prev) return 0;
                prev = cased = 1;
            } else prev = 0;
            break;
        case JU_ISSPACE: if (!ju_isspace(c)) return 0; cased = 1; break;
        case JU_ISALPHA: if (!is_alpha(c)) return 0; cased = 1; break;
        case JU_ISDIGIT: if (!is_digit(c)) return 0; cased = 1; break;
        case JU_ISDECIMAL: if (cat(c) != UTF8PROC_CATEGORY_ND) return 0; cased = 1; break;
        case JU_ISALNUM: if (!(is_alpha(c) || is_digit(c) || IN(JU_ALNUM, c))) return 0; cased = 1; break;
        default: return 0;
        }
    }
    return cased;
}
