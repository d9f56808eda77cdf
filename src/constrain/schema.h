/* schema.h: a JSON Schema (the subset structured-output APIs accept) compiled to rules of an NFA
 * (nfa.h) whose language is JSON text valid under the schema, printed the way xgrammar prints it
 * by default: compact (no whitespace, "," and ":" separators), object properties in the
 * schema's order (required ones always, optional ones may be left out), strings with JSON
 * escapes.
 *
 * Keywords: type (one or a list; absent: the types the other keywords imply, or any), nullable
 * (OpenAPI: or null), properties, required (names listed in properties), additionalProperties
 * (false by default, as xgrammar's strict mode; true or a schema: more properties after the
 * listed ones, named without escapes and by none of the listed names; an object schema with
 * neither properties nor additionalProperties is any object), enum, const (printed as given,
 * with "type" next to them filtering the values), items, prefixItems, minItems, maxItems (at
 * most 1000), minLength, maxLength (at most 10000; characters: a raw code point or one escape,
 * \u escapes of surrogates never printed), pattern (its regex fullmatches the string's value,
 * regex.h; characters that need it are printed escaped), format (date, time, date-time as RFC
 * 3339 with leap years exact, upper-case T and Z, seconds 00-59; uuid; email; ipv4), minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum (exact for a validator that reads the text as a
 * double; bounded numbers are printed without exponent), anyOf (the union), oneOf (the union,
 * only when the branches are provably disjoint: distinct types, distinct const / enum values,
 * or objects told apart by a required const / enum property or by a property one requires and
 * the other's additionalProperties false forbids), allOf of one schema, $ref to a local JSON
 * pointer ("#", "#/$defs/...", "#/definitions/...": each target one rule, so recursion works),
 * $defs / definitions, and the annotations title, description, $schema, $id, default,
 * examples, $comment, readOnly, writeOnly, deprecated (ignored).  Keywords next to $ref, anyOf,
 * oneOf, allOf, enum / const (but "type"), and pattern next to format, are refused rather than
 * intersected.  Anything else is refused with one line naming the keyword and its JSON pointer
 * ("schema: unsupported keyword 'not' at /properties/a"), never dropped silently.
 * The schema true / {} is any JSON value; json_object (sm_schema_any_object) is any JSON
 * object, nested to any depth.  any_whitespace allows [ \n\t\r]* between tokens (unbounded).
 */
#ifndef SM_SCHEMA_H
#define SM_SCHEMA_H
#include <stddef.h>
#include "base/err.h"
#include "constrain/nfa.h"

typedef struct sm_schema_opts {
    int any_whitespace;  /* 1: optional whitespace (space, \n, \t, \r) between JSON tokens;
                            0 (default): compact */
} sm_schema_opts;

/* Compile the schema text [len bytes, JSON] into rule 0 of n (n fresh: sm_nfa_init).  -1 with
 * one line in e. */
int sm_schema_compile(sm_nfa *n, const char *text, size_t len, const sm_schema_opts *o, sm_err *e);
/* Rule 0 of n: any JSON object (json_object). */
int sm_schema_any_object(sm_nfa *n, const sm_schema_opts *o, sm_err *e);

#endif
