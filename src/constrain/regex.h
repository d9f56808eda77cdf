/* regex.h: a regular expression (the syntax JSON Schema `pattern` and vLLM's `regex` use: the
 * ECMA / Python / PCRE common subset) compiled to an NFA fragment (nfa.h) over UTF-8 bytes.
 *
 * Supported: literals, escapes (\n \t \r \f \v \0 \xHH \x{H..} \uHHHH \u{H..} \\ and escaped
 * punctuation; a pair \uD83D\uDE00 is one code point; in a class \b is the backspace),
 * classes [...] with ranges, negation and the shorthands \d \w \s \D \W \S (below), `.`
 * (below), groups (...) (?:...) (?P<name>...) (?<name>...) (?'name'...), alternation,
 * quantifiers * + ? {m} {m,} {m,n} and their lazy forms (the same language under a fullmatch),
 * ^ at the very start and $ at the very end (the whole string is matched either way).  Refused
 * with one line naming the construct and its byte offset: possessive quantifiers (a*+a matches
 * nothing: read as greedy they would relax the regex), backreferences, lookaround, atomic
 * groups, anchors elsewhere, \b \B, inline flags, Unicode property and POSIX classes, a class
 * range from or to a shorthand ([\w-.], as PCRE2 and Python), {,n} (PCRE2 before 10.43 reads it
 * literally, Python as {0,n}), repetition counts above SM_REGEX_MAX_REPEAT, a pattern whose
 * expanded repetitions exceed SM_NFA_MAX_STATES, groups nested deeper than 200, an unbalanced
 * or empty construct.
 * Shorthands and `.`: a generated string must be valid under every meaning its validator may
 * give them: the Unicode one (Python's `re` on str patterns, which the `jsonschema` package
 * uses for `pattern`; ECMA-262's `.`) and PCRE2's ASCII one.  So each reads the intersection
 * of its meanings, a deliberate narrowing, never a relaxation:
 *   \d \w \s   [0-9], [A-Za-z0-9_], [\t\n\v\f\r ] (ASCII, a subset of the Unicode classes);
 *   \D \W \S   their complements within ASCII only (a complement over all code points would
 *              hold Unicode digits, letters and spaces: \W would give 'ş', \S U+00A0, \D '٣'):
 *              \D = [\x00-\x2F\x3A-\x7F], \W = ASCII but [A-Za-z0-9_], \S = ASCII but white
 *              space and \x1C-\x1F (white space to Python): [\x00-\x08\x0E-\x1B\x21-\x7F];
 *   [^...]     holding any shorthand, complemented within ASCII only ([^\w] = ASCII non-word
 *              characters, [^\s,] = ASCII but white space, \x1C-\x1F and ','; what a negated
 *              class excludes is read widely, so \s and \S there both cover \x1C-\x1F and
 *              [^\S] = [\t\n\v\f\r ]); without one, over all code points ([^"\\] reads any
 *              code point but '"' and '\');
 *   .          any code point but \n \r U+2028 U+2029 (ECMA's; Python and PCRE2 exclude only \n).
 * A class holding a shorthand and its complement ([\s\S], [\d\D], [\w\W]: every character
 * under either meaning, the idiom for "any text") reads every code point; negated, none.
 * Code points are matched as their UTF-8 encodings; a class holds code points, so [^a] reads
 * any one UTF-8 code point but 'a' (never a lone byte of one).
 * We rejected PCRE2's own compiled form: its bytecode has no byte-level transition function to
 * determinize; PCRE2 is the oracle the tests compare against (tests/test_regex.c).
 */
#ifndef SM_REGEX_H
#define SM_REGEX_H
#include <stddef.h>
#include "base/err.h"
#include "constrain/nfa.h"

#define SM_REGEX_MAX_REPEAT 1000 /* largest m or n of {m,n} */

/* Compile the regex src [len bytes, UTF-8] into a fragment of n matching exactly the strings
 * the regex fullmatches.  -1 with one line in e ("regex: <what> at offset <k>"). */
int sm_regex_compile(sm_nfa *n, const char *src, size_t len, sm_frag *out, sm_err *e);

#endif
