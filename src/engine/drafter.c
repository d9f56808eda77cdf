/* drafter.c: prompt-lookup drafting (see drafter.h).
 *
 * For g = 3, 2, 1: find the largest i < n - g with hist[i, i+g) == hist[n-g, n); the drafts
 * are seq[i+g], seq[i+g+1], ... where seq is hist followed by the drafts already proposed
 * (i+g+k < n+k, so every index is defined).  We rejected building a suffix index per request:
 * histories are at most max_len tokens and a backward scan stops at the latest match, which
 * in repetitive text is near the end.
 */
#include "engine/drafter.h"

/* Token k of the history extended by the drafts proposed so far. */
static int ext_at(const int *hist, int n, const int *out, int k) {
    return k < n ? hist[k] : out[k - n];
}

int sm_draft_ngram(const int *hist, int n, int ndraft, int *out) {
    if (ndraft <= 0) return 0;
    if (!hist || n < 1) {
        for (int k = 0; k < ndraft; k++) out[k] = 0;
        return 0;
    }
    for (int g = SM_DRAFT_MAX_NGRAM; g >= 1; g--) {
        if (n < g + 1) continue; /* need the suffix and one earlier start */
        const int *suf = hist + n - g;
        /* latest earlier occurrence: scan start positions from n-g-1 down to 0 */
        for (int i = n - g - 1; i >= 0; i--) {
            int j = 0;
            while (j < g && hist[i + j] == suf[j]) j++;
            if (j < g) continue;
            /* copy the continuation, reading through the drafts once past the history */
            for (int k = 0; k < ndraft; k++) out[k] = ext_at(hist, n, out, i + g + k);
            return g;
        }
    }
    /* no match: repeat the last token */
    for (int k = 0; k < ndraft; k++) out[k] = hist[n - 1];
    return 0;
}
