/* drafter.h: the n-gram ("prompt lookup") drafter of the speculative verify step.
 *
 * It proposes the tokens that followed the latest earlier occurrence of the request's last
 * n tokens (n = 3, then 2, then 1) in the request's own history (prompt + generated), and
 * falls back to repeating the last token.  It costs a linear scan of the history, no model
 * and no state.  We rejected a learned draft head (EAGLE-style) for this first engine: it
 * needs its own weights and training; the verify step and the aux hidden states it would
 * read are in place, so it can be added behind the same call later.
 */
#ifndef SM_DRAFTER_H
#define SM_DRAFTER_H

#define SM_DRAFT_MAX_NGRAM 3 /* longest suffix n-gram looked up */

/* Propose ndraft tokens after hist [n] into out [ndraft].  The continuation is read from the
 * history extended by the drafts themselves, so a match that ends near the end of the history
 * continues periodically (…abcab -> c a b …).  Returns the n-gram length that matched (3, 2
 * or 1), or 0 when none matched (then out repeats hist[n-1]; with n < 1, out is all 0). */
int sm_draft_ngram(const int *hist, int n, int ndraft, int *out);

#endif
