/*
 * collector._otlpfast: a compiled fast path for OTLP/HTTP protobuf trace requests.
 *
 * Parses the protobuf wire format of an ExportTraceServiceRequest directly (no upb objects) and
 * builds the same raw columns as collector.decode.decode_export_request: the OpenTelemetry
 * columns and the attribute (key, value) lists. It knows no attribute convention: the coordination
 * columns are mapped afterwards from collector/conventions.py's table. The Python wrapper is
 * collector/fastdecode.py; its docstring lists what this code handles and when it returns None
 * (the caller then decodes the whole request with the Python path).
 *
 * Two passes:
 *   1. parse (GIL released): walk the wire data, validate everything upb would validate
 *      (structure, varints, lengths, groups, UTF-8 of every string field) and record spans,
 *      attributes and array items as slices of the payload. Anything unsupported or malformed
 *      makes the call return None.
 *   2. build (GIL held): create the Python column lists, attribute triples and error messages.
 *
 * Return codes inside the parser: OK (0), FALLBACK (-1: return None), NOMEM (-2).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define OK 0
#define FALLBACK (-1)
#define NOMEM (-2)
#define LIMIT (-3) /* a per-request count limit was passed (Ctx.limit says which) */
enum { LIMIT_NONE = 0, LIMIT_SPANS, LIMIT_ITEMS };

#define MAX_ANY_DEPTH 16   /* AnyValue nesting validated; deeper values are skipped (see parse_any) */
#define MAX_GROUP_DEPTH 16 /* nesting of unknown groups skipped before giving up */
#define CACHE_SIZE 2048    /* string cache slots per call (power of two) */
#define CACHE_MAX_LEN 64   /* values longer than this are not cached (keys always are) */
#define CACHE_MAX_PROBES 16 /* a string whose slot run is longer is simply not cached */

/* json.dumps and its keyword arguments (ensure_ascii=False, separators=(",", ":")), module init. */
static PyObject *g_json_dumps, *g_json_kwargs;

/* Interned constants (module init). */
static PyObject *S_empty, *S_brackets, *S_true, *S_false;
static PyObject *S_unknown_service;
static PyObject *S_kinds[6], *S_codes[3];

/* ------------------------------------------------------------------------------------------ */
/* Parsed structures (slices of the payload)                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
} Slice;

/* AK_UNSUP: a kvlist while parsing; AK_COMPLEX: a kvlist or an array with a non-string item, which
   pass 2 converts like any_value from the raw AnyValue (Attr.val). */
enum { AK_NONE = 0, AK_STR, AK_BOOL, AK_INT, AK_DOUBLE, AK_ARRAY, AK_BYTES, AK_UNSUP, AK_COMPLEX };

typedef struct {
    Slice key;
    Slice s; /* AK_STR / AK_BYTES */
    int64_t i;
    double d;
    Py_ssize_t item0, nitems; /* AK_ARRAY: string items in Ctx.items */
    uint64_t h;               /* hash of key */
    Slice val;                /* the KeyValue's value field (the last one) */
    int nval;                 /* how many value fields the KeyValue had */
    Py_ssize_t use;           /* duplicate keys: the attribute (index in its list) whose value counts */
    int skip;                 /* a later duplicate of an earlier key: not a pair of its own */
    int kind;
    int bad; /* AK_ARRAY with a non-string item */
} Attr;

/* What parse_kv / parse_any expect of a fresh Attr (cheaper than a memset of the whole struct,
   which this hot loop would do for every attribute). */
static inline void attr_init(Attr *a) {
    a->key.p = NULL;
    a->key.n = 0;
    a->kind = AK_NONE;
    a->nval = 0;
    a->bad = 0;
    a->use = 0;
    a->skip = 0;
}

typedef struct {
    Slice name, version;
    Py_ssize_t res;
} Scope;

typedef struct {
    Py_ssize_t a0, n; /* range in Ctx.rattrs */
    Py_ssize_t nuniq; /* distinct keys */
    int over;         /* more attributes than max_attrs: its spans are rejected */
} Res;

enum {
    REASON_NONE = 0,
    REASON_TRACE_ID,
    REASON_SPAN_ID,
    REASON_PARENT,
    REASON_START_ZERO,
    REASON_OVERFLOW,
    REASON_END_BEFORE_START,
    REASON_TOO_MANY_ATTRS, /* the span, a kept event or link, or its resource has > max_attrs */
};

typedef struct {
    Slice tid, sid, pid, tstate, name, smsg;
    uint64_t start, end;
    int32_t kind, code;
    Py_ssize_t a0, na, scope;
    Py_ssize_t nuniq;  /* distinct attribute keys */
    Py_ssize_t e0, ne; /* events and links, in Ctx.events */
    int reason;
} Span;

/* A Span.Event or Span.Link (is_link); attributes in Ctx.eattrs. */
typedef struct {
    Slice name, tid, sid, tstate;
    uint64_t time;
    Py_ssize_t a0, na;
    int is_link;
    int over; /* more attributes than max_attrs (only the first max_attrs are kept) */
} Event;

typedef struct {
    uint64_t h;
    const uint8_t *p;
    Py_ssize_t n;
    PyObject *s;
} CacheEnt;

typedef struct {
    Attr *attrs;
    Py_ssize_t nattrs, cattrs;
    Attr *rattrs;
    Py_ssize_t nrattrs, crattrs;
    Slice *items;
    Py_ssize_t nitems, citems;
    Span *spans;
    Py_ssize_t nspans, cspans;
    Event *events;
    Py_ssize_t nevents, cevents;
    Attr *eattrs;
    Py_ssize_t neattrs, ceattrs;
    Scope *scopes;
    Py_ssize_t nscopes, cscopes;
    Res *res;
    Py_ssize_t nres, cres;
    Py_ssize_t max_bytes, max_items, max_depth;
    /* counts bounded while parsing (issue 12): spans per request, attributes per span / event /
       link / resource, and messages + values per request (work: see count_item) */
    Py_ssize_t max_spans, max_attrs, max_work, work;
    int limit;
    /* pass 2 */
    CacheEnt *cache;
    Py_ssize_t ncache;
    char *buf;
    Py_ssize_t cbuf;
} Ctx;

static int grow(void **ptr, Py_ssize_t *cap, size_t size) {
    Py_ssize_t ncap = *cap ? *cap * 2 : 64;
    if ((size_t)ncap > PY_SSIZE_T_MAX / size) return NOMEM;
    void *np = PyMem_RawRealloc(*ptr, (size_t)ncap * size);
    if (!np) return NOMEM;
    *ptr = np;
    *cap = ncap;
    return OK;
}
#define ENSURE(arr, n, cap)                                                        \
    do {                                                                           \
        if ((n) >= (cap)) {                                                        \
            int rc_ = grow((void **)&(arr), &(cap), sizeof(*(arr)));               \
            if (rc_) return rc_;                                                   \
        }                                                                          \
    } while (0)
#define CHECK(expr)                 \
    do {                            \
        int rc_ = (expr);           \
        if (rc_) return rc_;        \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Wire primitives                                                                            */
/* ------------------------------------------------------------------------------------------ */

static inline int rd_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) return FALLBACK;
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return OK;
        }
    }
    return FALLBACK; /* more than 10 bytes: upb says malformed */
}

/* A tag as upb reads it: at most 5 bytes, fitting 32 bits, field number > 0, wire type 0-5. */
static inline int rd_tag(const uint8_t **pp, const uint8_t *end, uint32_t *field, int *wt) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    int i;
    for (i = 0; i < 5; i++) {
        if (p >= end) return FALLBACK;
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) break;
    }
    if (i == 5 || v > 0xFFFFFFFFull) return FALLBACK;
    *wt = (int)(v & 7);
    *field = (uint32_t)(v >> 3);
    if (*field == 0 || *wt > 5) return FALLBACK;
    *pp = p;
    return OK;
}

/* A length prefix as upb reads it: a varint of at most 5 bytes (over-long encodings within 5 bytes
   are accepted, a 6th byte is malformed) whose value is below INT32_MAX and fits the buffer. */
static inline int rd_len(const uint8_t **pp, const uint8_t *end, Slice *out) {
    const uint8_t *p = *pp;
    uint64_t n = 0;
    int i;
    for (i = 0; i < 5; i++) {
        if (p >= end) return FALLBACK;
        uint8_t b = *p++;
        n |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) break;
    }
    if (i == 5 || n >= INT32_MAX || n > (uint64_t)(end - p)) return FALLBACK;
    out->p = p;
    out->n = (Py_ssize_t)n;
    *pp = p + n;
    return OK;
}

static inline int rd_fixed64(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    if (end - *pp < 8) return FALLBACK;
    const uint8_t *p = *pp;
    *out = (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
    *pp += 8;
    return OK;
}

/* Skip one field's value (the tag is already read), as upb skips unknown fields. */
static int skip_field(const uint8_t **pp, const uint8_t *end, uint32_t field, int wt, int depth) {
    uint64_t v;
    Slice s;
    switch (wt) {
    case 0:
        return rd_varint(pp, end, &v);
    case 1:
        return rd_fixed64(pp, end, &v);
    case 2:
        return rd_len(pp, end, &s);
    case 5:
        if (end - *pp < 4) return FALLBACK;
        *pp += 4;
        return OK;
    case 3:
        if (depth >= MAX_GROUP_DEPTH) return FALLBACK;
        for (;;) {
            uint32_t f;
            int w;
            CHECK(rd_tag(pp, end, &f, &w));
            if (w == 4) return f == field ? OK : FALLBACK;
            CHECK(skip_field(pp, end, f, w, depth + 1));
        }
    default: /* a stray end-group tag */
        return FALLBACK;
    }
}

/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF), as upb requires of proto3 strings. */
static int utf8_valid(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
        } else if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (p[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            uint8_t c1 = p[i + 1], c2 = p[i + 2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0;
            if (c == 0xED && c1 >= 0xA0) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            uint8_t c1 = p[i + 1], c2 = p[i + 2], c3 = p[i + 3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;
            if (c == 0xF4 && c1 >= 0x90) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static inline int rd_str(const uint8_t **pp, const uint8_t *end, Slice *out) {
    CHECK(rd_len(pp, end, out));
    return utf8_valid(out->p, out->n) ? OK : FALLBACK;
}

static inline int is_ascii(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w & 0x8080808080808080ull) return 0;
    }
    for (; i < n; i++)
        if (p[i] & 0x80) return 0;
    return 1;
}

/* Random per process (module init): keys cannot be chosen to collide in the duplicate-key table or
   the string cache (hash flooding, issue 12); both are bounded in the worst case as well. */
static uint64_t g_hash_seed = 0x9E3779B97F4A7C15ull;

static inline uint64_t hash_bytes(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = g_hash_seed ^ ((uint64_t)n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, p, 8);
        h = (h ^ k) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t k = 0;
        memcpy(&k, p, (size_t)n);
        h = (h ^ k) * 0xc4ceb9fe1a85ec53ull;
        h ^= h >> 29;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* ------------------------------------------------------------------------------------------ */
/* Pass 1: parse and validate                                                                 */
/* ------------------------------------------------------------------------------------------ */

static int parse_kv_validate(Ctx *c, Slice m, int depth);

/* Validate a KeyValueList (kvlist_value) without keeping anything. */
/* One more message or value of the request (ResourceSpans, ScopeSpans, span, event, link,
   attribute, AnyValue array item or kvlist entry at any depth): LIMIT past max_work. */
static inline int count_item(Ctx *c) {
    if (++c->work > c->max_work) {
        c->limit = LIMIT_ITEMS;
        return LIMIT;
    }
    return OK;
}

static int parse_kvlist_validate(Ctx *c, Slice m, int depth) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == 1 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(count_item(c));
            CHECK(parse_kv_validate(c, s, depth));
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

/*
 * Parse an AnyValue into *a, merging into what *a already holds (a repeated occurrence of a
 * message field merges; the oneof keeps the last member set, and a second array_value while
 * the array is the current member appends to it, as upb does). At depth 0 (an attribute's
 * value) array items are kept; deeper, values are only validated and arrays/kvlists become
 * AK_UNSUP.
 */
static int parse_any(Ctx *c, Slice m, Attr *a, int depth) {
    /* Deeper than MAX_ANY_DEPTH is past the max_depth cut: the value becomes the truncation
       marker and is never built, so it is skipped unread (its length is known). upb refuses the
       whole request past its recursion limit (32 kvlist or 48 array levels); one deep value
       costs only itself here (issue 32), as the Go Collector accepts 10,000 levels. */
    if (depth > MAX_ANY_DEPTH) return c->max_depth < MAX_ANY_DEPTH ? OK : FALLBACK;
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        uint64_t v;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == 1 && wt == 2) {
            CHECK(rd_str(&p, end, &a->s));
            a->kind = AK_STR;
        } else if (f == 2 && wt == 0) {
            CHECK(rd_varint(&p, end, &v));
            a->kind = AK_BOOL;
            a->i = v != 0;
        } else if (f == 3 && wt == 0) {
            CHECK(rd_varint(&p, end, &v));
            a->kind = AK_INT;
            a->i = (int64_t)v;
        } else if (f == 4 && wt == 1) {
            CHECK(rd_fixed64(&p, end, &v));
            a->kind = AK_DOUBLE;
            memcpy(&a->d, &v, 8);
        } else if (f == 5 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            if (depth == 0 && a->kind != AK_ARRAY) {
                a->kind = AK_ARRAY;
                a->item0 = c->nitems;
                a->nitems = 0;
                a->bad = 0;
            } else if (depth > 0) {
                a->kind = AK_UNSUP;
            }
            const uint8_t *q = s.p, *qend = s.p + s.n;
            while (q < qend) {
                uint32_t g;
                int w;
                Slice t;
                CHECK(rd_tag(&q, qend, &g, &w));
                if (g == 1 && w == 2) {
                    CHECK(rd_len(&q, qend, &t));
                    CHECK(count_item(c));
                    Attr item;
                    attr_init(&item);
                    CHECK(parse_any(c, t, &item, depth + 1));
                    if (depth == 0) {
                        if (item.kind == AK_STR) {
                            ENSURE(c->items, c->nitems, c->citems);
                            c->items[c->nitems++] = item.s;
                            a->nitems++;
                        } else {
                            a->bad = 1;
                        }
                    }
                } else {
                    CHECK(skip_field(&q, qend, g, w, 0));
                }
            }
        } else if (f == 6 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(parse_kvlist_validate(c, s, depth + 1));
            a->kind = AK_UNSUP;
        } else if (f == 7 && wt == 2) {
            CHECK(rd_len(&p, end, &a->s));
            a->kind = AK_BYTES;
        } else if (f == 8 && wt == 0) { /* string_value_strindex: a oneof member any_value maps to None */
            CHECK(rd_varint(&p, end, &v));
            a->kind = AK_NONE;
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

/* Parse a KeyValue into *a (which the caller zeroed). */
static int parse_kv(Ctx *c, Slice m, Attr *a, int depth) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == 1 && wt == 2) {
            CHECK(rd_str(&p, end, &a->key));
        } else if (f == 2 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(parse_any(c, s, a, depth));
            a->val = s;
            a->nval++;
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    a->h = hash_bytes(a->key.p, a->key.n);
    return OK;
}

static int parse_kv_validate(Ctx *c, Slice m, int depth) {
    Attr scratch;
    attr_init(&scratch);
    return parse_kv(c, m, &scratch, depth);
}

static inline int same_key(const Attr *x, const Attr *y) {
    /* a missing key is a NULL slice: memcmp must not see it (even with length 0) */
    return x->h == y->h && x->key.n == y->key.n &&
           (x->key.n == 0 || memcmp(x->key.p, y->key.p, (size_t)x->key.n) == 0);
}

/* x repeats the key of the first attribute y: a dict keeps y's position and x's value. */
static inline void mark_duplicate(Attr *attrs, Py_ssize_t y, Py_ssize_t x) {
    attrs[y].use = x;
    attrs[x].skip = 1;
}

/*
 * Attributes of an accepted span (or of its events and links) or of a resource: FALLBACK for
 * what the fast path does not build; duplicate keys are resolved as a dict does (the first
 * position, the last value: Attr.use / Attr.skip) and *nuniq counts the distinct keys.
 */
static int check_attrs(Ctx *c, Attr *attrs, Py_ssize_t n, Py_ssize_t *nuniq) {
    *nuniq = n;
    for (Py_ssize_t k = 0; k < n; k++) {
        Attr *a = &attrs[k];
        a->use = k;
        a->skip = 0;
        if (a->kind == AK_UNSUP || (a->kind == AK_ARRAY && a->bad)) {
            /* a value split over several fields would have to be merged before converting */
            if (a->nval != 1) return FALLBACK;
            a->kind = AK_COMPLEX;
        }
        /* keys that _truncate would change could collide after the change */
        if (a->key.n > c->max_bytes || (a->key.n && memchr(a->key.p, 0, (size_t)a->key.n)))
            return FALLBACK;
    }
    if (n < 2) return OK;
    if (n <= 32) {
        for (Py_ssize_t x = 1; x < n; x++)
            for (Py_ssize_t y = 0; y < x; y++)
                if (!attrs[y].skip && same_key(&attrs[x], &attrs[y])) {
                    mark_duplicate(attrs, y, x);
                    --*nuniq;
                    break;
                }
        return OK;
    }
    size_t size = 64;
    while (size < (size_t)n * 2) size *= 2;
    Py_ssize_t *table = PyMem_RawMalloc(size * sizeof(Py_ssize_t));
    if (!table) return NOMEM;
    for (size_t t = 0; t < size; t++) table[t] = -1;
    for (Py_ssize_t x = 0; x < n; x++) {
        size_t slot = (size_t)attrs[x].h & (size - 1);
        for (;;) {
            Py_ssize_t y = table[slot];
            if (y < 0) {
                table[slot] = x; /* the first attribute with this key */
                break;
            }
            if (same_key(&attrs[x], &attrs[y])) {
                mark_duplicate(attrs, y, x);
                --*nuniq;
                break;
            }
            slot = (slot + 1) & (size - 1);
        }
    }
    PyMem_RawFree(table);
    return OK;
}

#define MAX_NS 0x7FFFFFFFFFFFFFFFull

static int span_reason(const Span *sp) {
    static const uint8_t zeros[16] = {0};
    if (sp->tid.n != 16 || memcmp(sp->tid.p, zeros, 16) == 0) return REASON_TRACE_ID;
    if (sp->sid.n != 8 || memcmp(sp->sid.p, zeros, 8) == 0) return REASON_SPAN_ID;
    if (sp->pid.n != 0 && sp->pid.n != 8) return REASON_PARENT;
    if (sp->start == 0) return REASON_START_ZERO;
    if (sp->start > MAX_NS || sp->end > MAX_NS) return REASON_OVERFLOW;
    if (sp->end < sp->start) return REASON_END_BEFORE_START;
    return REASON_NONE;
}

/* A Span.Event or Span.Link into Ctx.events (its attributes into Ctx.eattrs). */

/* Parse (validate) a KeyValue past the attribute cap without keeping it or its array items. */
static int parse_kv_discard(Ctx *c, Slice m) {
    Attr scratch;
    attr_init(&scratch);
    Py_ssize_t items0 = c->nitems;
    int rc = parse_kv(c, m, &scratch, 0);
    c->nitems = items0;
    return rc;
}

static int parse_event_or_link(Ctx *c, Slice m, int is_link) {
    ENSURE(c->events, c->nevents, c->cevents);
    Event *ev = &c->events[c->nevents];
    memset(ev, 0, sizeof *ev);
    ev->is_link = is_link;
    ev->a0 = c->neattrs;
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (!is_link && f == 1 && wt == 1) {
            CHECK(rd_fixed64(&p, end, &ev->time));
        } else if (!is_link && f == 2 && wt == 2) {
            CHECK(rd_str(&p, end, &ev->name));
        } else if (is_link && (f == 1 || f == 2) && wt == 2) {
            CHECK(rd_len(&p, end, f == 1 ? &ev->tid : &ev->sid));
        } else if (is_link && f == 3 && wt == 2) {
            CHECK(rd_str(&p, end, &ev->tstate));
        } else if (wt == 2 && ((!is_link && f == 3) || (is_link && f == 4))) {
            CHECK(rd_len(&p, end, &s));
            CHECK(count_item(c));
            if (c->neattrs - ev->a0 >= c->max_attrs) {
                CHECK(parse_kv_discard(c, s));
                ev->over = 1;
                continue;
            }
            ENSURE(c->eattrs, c->neattrs, c->ceattrs);
            Attr *a = &c->eattrs[c->neattrs];
            attr_init(a);
            CHECK(parse_kv(c, s, a, 0));
            c->neattrs++;
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    ev->na = c->neattrs - ev->a0;
    c->nevents++;
    return OK;
}

static int parse_status(Span *sp, Slice m) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        uint64_t v;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == 2 && wt == 2) {
            CHECK(rd_str(&p, end, &sp->smsg));
        } else if (f == 3 && wt == 0) {
            CHECK(rd_varint(&p, end, &v));
            sp->code = (int32_t)(uint32_t)v;
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

static int parse_span(Ctx *c, Slice m, Py_ssize_t scope) {
    if (c->nspans >= c->max_spans) {
        c->limit = LIMIT_SPANS;
        return LIMIT;
    }
    CHECK(count_item(c));
    ENSURE(c->spans, c->nspans, c->cspans);
    Span *sp = &c->spans[c->nspans];
    memset(sp, 0, sizeof *sp);
    sp->scope = scope;
    sp->a0 = c->nattrs;
    sp->e0 = c->nevents;
    Py_ssize_t eattrs0 = c->neattrs;
    Py_ssize_t kept_events = 0, kept_links = 0;
    int over = 0;
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        uint64_t v;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (wt == 2) {
            switch (f) {
            case 1:
                CHECK(rd_len(&p, end, &sp->tid));
                continue;
            case 2:
                CHECK(rd_len(&p, end, &sp->sid));
                continue;
            case 3:
                CHECK(rd_str(&p, end, &sp->tstate));
                continue;
            case 4:
                CHECK(rd_len(&p, end, &sp->pid));
                continue;
            case 5:
                CHECK(rd_str(&p, end, &sp->name));
                continue;
            case 9: {
                CHECK(rd_len(&p, end, &s));
                CHECK(count_item(c));
                if (c->nattrs - sp->a0 >= c->max_attrs) {
                    CHECK(parse_kv_discard(c, s));
                    over = 1;
                    continue;
                }
                ENSURE(c->attrs, c->nattrs, c->cattrs);
                Attr *a = &c->attrs[c->nattrs];
                attr_init(a);
                CHECK(parse_kv(c, s, a, 0));
                c->nattrs++;
                continue;
            }
            case 11:
            case 13: {
                CHECK(rd_len(&p, end, &s));
                CHECK(count_item(c));
                Py_ssize_t *kept = f == 13 ? &kept_links : &kept_events;
                Py_ssize_t events0 = c->nevents, eattrs_before = c->neattrs, items0 = c->nitems;
                CHECK(parse_event_or_link(c, s, f == 13));
                if (*kept >= c->max_items) {
                    /* past the cut of max_array_items: validated, never built, not kept */
                    c->nevents = events0;
                    c->neattrs = eattrs_before;
                    c->nitems = items0;
                } else {
                    ++*kept;
                    over |= c->events[events0].over;
                }
                continue;
            }
            case 15:
                CHECK(rd_len(&p, end, &s));
                CHECK(parse_status(sp, s));
                continue;
            default:
                break;
            }
        } else if (wt == 0 && f == 6) {
            CHECK(rd_varint(&p, end, &v));
            sp->kind = (int32_t)(uint32_t)v;
            continue;
        } else if (wt == 1 && (f == 7 || f == 8)) {
            CHECK(rd_fixed64(&p, end, f == 7 ? &sp->start : &sp->end));
            continue;
        }
        CHECK(skip_field(&p, end, f, wt, 0));
    }
    sp->na = c->nattrs - sp->a0;
    sp->ne = c->nevents - sp->e0;
    sp->reason = span_reason(sp);
    if (sp->reason == REASON_NONE && over) sp->reason = REASON_TOO_MANY_ATTRS;
    if (sp->reason == REASON_NONE) {
        Py_ssize_t unused;
        CHECK(check_attrs(c, c->attrs + sp->a0, sp->na, &sp->nuniq));
        for (Py_ssize_t k = sp->e0; k < c->nevents; k++)
            CHECK(check_attrs(c, c->eattrs + c->events[k].a0, c->events[k].na, &unused));
    } else {
        /* a rejected span's attributes, events and links are never used */
        c->nattrs = sp->a0;
        sp->na = 0;
        c->nevents = sp->e0;
        sp->ne = 0;
        c->neattrs = eattrs0;
    }
    c->nspans++;
    return OK;
}

static int parse_scope(Ctx *c, Slice m, Py_ssize_t idx) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == 1 && wt == 2) {
            CHECK(rd_str(&p, end, &c->scopes[idx].name));
        } else if (f == 2 && wt == 2) {
            CHECK(rd_str(&p, end, &c->scopes[idx].version));
        } else if (f == 3 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(count_item(c));
            CHECK(parse_kv_validate(c, s, 1));
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

static int parse_scope_spans(Ctx *c, Slice m, Py_ssize_t res) {
    CHECK(count_item(c));
    ENSURE(c->scopes, c->nscopes, c->cscopes);
    Py_ssize_t idx = c->nscopes++;
    memset(&c->scopes[idx], 0, sizeof(Scope));
    c->scopes[idx].res = res;
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == 1 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(parse_scope(c, s, idx));
        } else if (f == 2 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(parse_span(c, s, idx));
        } else if (f == 3 && wt == 2) {
            CHECK(rd_str(&p, end, &s));
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

static int parse_entity_ref(Slice m) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f >= 1 && f <= 4 && wt == 2) {
            CHECK(rd_str(&p, end, &s));
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

static int parse_resource(Ctx *c, Slice m) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == 1 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(count_item(c));
            Res *r = &c->res[c->nres - 1];
            if (c->nrattrs - r->a0 >= c->max_attrs) {
                CHECK(parse_kv_discard(c, s));
                r->over = 1;
                continue;
            }
            ENSURE(c->rattrs, c->nrattrs, c->crattrs);
            Attr *a = &c->rattrs[c->nrattrs];
            attr_init(a);
            CHECK(parse_kv(c, s, a, 0));
            c->nrattrs++;
        } else if (f == 3 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(parse_entity_ref(s));
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

static int parse_resource_spans(Ctx *c, Slice m) {
    CHECK(count_item(c));
    ENSURE(c->res, c->nres, c->cres);
    Py_ssize_t idx = c->nres++;
    c->res[idx].a0 = c->nrattrs;
    c->res[idx].over = 0;
    Py_ssize_t spans0 = c->nspans;
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == 1 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(parse_resource(c, s));
        } else if (f == 2 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(parse_scope_spans(c, s, idx));
        } else if (f == 3 && wt == 2) {
            CHECK(rd_str(&p, end, &s));
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    c->res[idx].n = c->nrattrs - c->res[idx].a0;
    if (c->res[idx].over) {
        /* every span under a resource with too many attributes is rejected; nothing of it is kept */
        for (Py_ssize_t s = spans0; s < c->nspans; s++)
            if (c->spans[s].reason == REASON_NONE) c->spans[s].reason = REASON_TOO_MANY_ATTRS;
        c->nrattrs = c->res[idx].a0;
        c->res[idx].n = 0;
        c->res[idx].nuniq = 0;
        return OK;
    }
    return check_attrs(c, c->rattrs + c->res[idx].a0, c->res[idx].n, &c->res[idx].nuniq);
}

/* Room for a typical request up front, so the vectors are not copied while they grow (an
   attribute takes at least 4 bytes of wire data, usually 30-60; a span at least 30). */
static int presize(Ctx *c, Py_ssize_t n) {
    Py_ssize_t attrs = n / 32 + 16, spans = n / 256 + 4, nitems = n / 64 + 16;
    /* bounded: a huge body grows the vectors as usual */
    attrs = attrs < 65536 ? attrs : 65536;
    spans = spans < 8192 ? spans : 8192;
    nitems = nitems < 16384 ? nitems : 16384;
    Attr *a = PyMem_RawMalloc((size_t)attrs * sizeof(Attr));
    Span *s = PyMem_RawMalloc((size_t)spans * sizeof(Span));
    Slice *items = PyMem_RawMalloc((size_t)nitems * sizeof(Slice));
    if (!a || !s || !items) {
        PyMem_RawFree(a);
        PyMem_RawFree(s);
        PyMem_RawFree(items);
        return NOMEM;
    }
    c->attrs = a;
    c->cattrs = attrs;
    c->spans = s;
    c->cspans = spans;
    c->items = items;
    c->citems = nitems;
    return OK;
}

static int parse_request(Ctx *c, const uint8_t *data, Py_ssize_t n) {
    CHECK(presize(c, n));
    const uint8_t *p = data, *end = data + n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == 1 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(parse_resource_spans(c, s));
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Counting only: the guard in front of the Python path (collector.decode.check_request_counts)  */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    Py_ssize_t spans, work, max_spans, max_work;
    int limit;
} Counts;

static inline int count_one(Counts *k, int span) {
    if (span && ++k->spans > k->max_spans) {
        k->limit = LIMIT_SPANS;
        return LIMIT;
    }
    if (++k->work > k->max_work) {
        k->limit = LIMIT_ITEMS;
        return LIMIT;
    }
    return OK;
}

/* Deeper than this the counter stops (FALLBACK): upb refuses far shallower nesting itself. */
#define MAX_COUNT_DEPTH 200

static int count_kv(Counts *k, Slice m, int depth);

/* The items of an AnyValue: every array item and kvlist entry, at any depth. */
static int count_any(Counts *k, Slice m, int depth) {
    if (depth > MAX_COUNT_DEPTH) return FALLBACK;
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if ((f == 5 || f == 6) && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            const uint8_t *q = s.p, *qend = s.p + s.n;
            while (q < qend) {
                uint32_t g;
                int w;
                Slice t;
                CHECK(rd_tag(&q, qend, &g, &w));
                if (g == 1 && w == 2) {
                    CHECK(rd_len(&q, qend, &t));
                    CHECK(count_one(k, 0));
                    CHECK(f == 5 ? count_any(k, t, depth + 1) : count_kv(k, t, depth + 1));
                } else {
                    CHECK(skip_field(&q, qend, g, w, 0));
                }
            }
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

/* A KeyValue's value's items (the KeyValue itself is counted by the caller). */
static int count_kv(Counts *k, Slice m, int depth) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == 2 && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(count_any(k, s, depth));
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

/* Count the KeyValues in length-delimited field `want` of message m, and their values' items. */
static int count_field(Counts *k, Slice m, uint32_t want) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (f == want && wt == 2) {
            CHECK(rd_len(&p, end, &s));
            CHECK(count_one(k, 0));
            CHECK(count_kv(k, s, 0));
        } else {
            CHECK(skip_field(&p, end, f, wt, 0));
        }
    }
    return OK;
}

/* Every message and value of a request, as the compiled decoder and check_request_counts count
   them (ResourceSpans, ScopeSpans, scope attributes, spans, events, links, attributes of spans,
   events, links and resources, AnyValue items at any depth), keeping nothing: LIMIT as soon as
   one passes its maximum, FALLBACK where the wire format breaks (upb stops there too). */
static int count_request(Counts *k, Slice m, int level) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        CHECK(rd_tag(&p, end, &f, &wt));
        if (wt != 2) {
            CHECK(skip_field(&p, end, f, wt, 0));
            continue;
        }
        CHECK(rd_len(&p, end, &s));
        switch (level) {
        case 0: /* ExportTraceServiceRequest: resource_spans */
            if (f == 1) {
                CHECK(count_one(k, 0));
                CHECK(count_request(k, s, 1));
            }
            break;
        case 1: /* ResourceSpans: resource, scope_spans */
            if (f == 1) CHECK(count_field(k, s, 1));
            if (f == 2) {
                CHECK(count_one(k, 0));
                CHECK(count_request(k, s, 2));
            }
            break;
        case 2: /* ScopeSpans: scope (attributes = 3), spans */
            if (f == 1) CHECK(count_field(k, s, 3));
            if (f == 2) {
                CHECK(count_one(k, 1));
                CHECK(count_request(k, s, 3));
            }
            break;
        default: /* Span: attributes, events (attributes = 3), links (attributes = 4) */
            if (f == 9) {
                CHECK(count_one(k, 0));
                CHECK(count_kv(k, s, 0));
            }
            if (f == 11 || f == 13) {
                CHECK(count_one(k, 0));
                CHECK(count_field(k, s, f == 11 ? 3 : 4));
            }
        }
    }
    return OK;
}

static PyObject *count(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *payload;
    Counts k;
    memset(&k, 0, sizeof k);
    if (!PyArg_ParseTuple(args, "O!nn:count", &PyBytes_Type, &payload, &k.max_spans, &k.max_work)) return NULL;
    Slice m = {(const uint8_t *)PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload)};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = count_request(&k, m, 0);
    Py_END_ALLOW_THREADS
    if (rc == LIMIT) return PyUnicode_FromString(k.limit == LIMIT_SPANS ? "spans" : "items");
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------ */
/* Pass 2: Python objects                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* A str from bytes already validated as UTF-8. */
static PyObject *new_str(const uint8_t *p, Py_ssize_t n) {
    if (is_ascii(p, n)) {
        PyObject *s = PyUnicode_New(n, 127);
        if (s && n) memcpy(PyUnicode_1BYTE_DATA(s), p, (size_t)n);
        return s;
    }
    return PyUnicode_DecodeUTF8((const char *)p, n, "strict");
}

static int ensure_buf(Ctx *c, Py_ssize_t n) {
    if (n <= c->cbuf) return 0;
    Py_ssize_t cap = c->cbuf ? c->cbuf : 256;
    while (cap < n) cap *= 2;
    char *nb = PyMem_Realloc(c->buf, (size_t)cap);
    if (!nb) {
        PyErr_NoMemory();
        return -1;
    }
    c->buf = nb;
    c->cbuf = cap;
    return 0;
}

/* NUL bytes as U+FFFD (EF BF BD), as str.replace("\x00", "\ufffd") does. */
static PyObject *new_str_nul_replaced(Ctx *c, const uint8_t *p, Py_ssize_t n) {
    if (!n || !memchr(p, 0, (size_t)n)) return new_str(p, n);
    if (n > PY_SSIZE_T_MAX / 3 || ensure_buf(c, n * 3) < 0) return NULL;
    Py_ssize_t o = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i]) {
            c->buf[o++] = (char)p[i];
        } else {
            c->buf[o++] = (char)0xEF;
            c->buf[o++] = (char)0xBF;
            c->buf[o++] = (char)0xBD;
        }
    }
    return PyUnicode_DecodeUTF8(c->buf, o, "strict");
}

/* collector.decode._truncate of a wire string. */
static PyObject *make_text(Ctx *c, const uint8_t *p, Py_ssize_t n);

/* The str for these bytes (new ref), shared within one call; *entry is its cache slot or NULL
   when the cache is full. */
static PyObject *cached_entry(Ctx *c, const uint8_t *p, Py_ssize_t n, uint64_t h, CacheEnt **entry) {
    size_t mask = CACHE_SIZE - 1, slot = (size_t)h & mask;
    int probes = 0, free_slot = 0;
    *entry = NULL;
    for (; probes < CACHE_MAX_PROBES; probes++) {
        CacheEnt *e = &c->cache[slot];
        if (!e->s) {
            free_slot = 1;
            break;
        }
        /* an empty scope name or version is a NULL slice: no memcmp for length 0 */
        if (e->h == h && e->n == n && (n == 0 || memcmp(e->p, p, (size_t)n) == 0)) {
            Py_INCREF(e->s);
            *entry = e;
            return e->s;
        }
        slot = (slot + 1) & mask;
    }
    PyObject *s = new_str(p, n);
    if (s && free_slot && c->ncache < CACHE_SIZE / 2) {
        CacheEnt *e = &c->cache[slot];
        e->h = h;
        e->p = p;
        e->n = n;
        e->s = s;
        Py_INCREF(s);
        c->ncache++;
        *entry = e;
    }
    return s;
}

static PyObject *cached_str(Ctx *c, const uint8_t *p, Py_ssize_t n, uint64_t h) {
    CacheEnt *unused;
    return cached_entry(c, p, n, h, &unused);
}

static PyObject *make_text(Ctx *c, const uint8_t *p, Py_ssize_t n) {
    if (n <= c->max_bytes) {
        if (n && memchr(p, 0, (size_t)n)) return new_str_nul_replaced(c, p, n);
        if (n <= CACHE_MAX_LEN) return cached_str(c, p, n, hash_bytes(p, n));
        return new_str(p, n);
    }
    /* encoded[:max].decode("utf-8", "ignore"): drop a character cut in two */
    Py_ssize_t cut = c->max_bytes;
    while (cut > 0 && (p[cut] & 0xC0) == 0x80) cut--;
    PyObject *head = new_str_nul_replaced(c, p, cut);
    if (!head) return NULL;
    PyObject *out = PyUnicode_FromFormat("%U...[truncated %zd bytes]", head, n - cut);
    Py_DECREF(head);
    return out;
}

static PyObject *hex_str(const uint8_t *p, Py_ssize_t n) {
    static const char digits[] = "0123456789abcdef";
    PyObject *s = PyUnicode_New(n * 2, 127);
    if (!s) return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        d[2 * i] = (Py_UCS1)digits[p[i] >> 4];
        d[2 * i + 1] = (Py_UCS1)digits[p[i] & 15];
    }
    return s;
}

static PyObject *b64_str(const uint8_t *p, Py_ssize_t n) {
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    Py_ssize_t out_n = (n + 2) / 3 * 4;
    PyObject *s = PyUnicode_New(out_n, 127);
    if (!s) return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(s);
    Py_ssize_t i = 0, o = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        d[o++] = (Py_UCS1)tbl[v >> 18];
        d[o++] = (Py_UCS1)tbl[(v >> 12) & 63];
        d[o++] = (Py_UCS1)tbl[(v >> 6) & 63];
        d[o++] = (Py_UCS1)tbl[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        d[o++] = (Py_UCS1)tbl[v >> 18];
        d[o++] = (Py_UCS1)tbl[(v >> 12) & 63];
        d[o++] = '=';
        d[o++] = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        d[o++] = (Py_UCS1)tbl[v >> 18];
        d[o++] = (Py_UCS1)tbl[(v >> 12) & 63];
        d[o++] = (Py_UCS1)tbl[(v >> 6) & 63];
        d[o++] = '=';
    }
    return s;
}

/* A growable byte buffer for JSON text. */
typedef struct {
    char *p;
    Py_ssize_t n, cap;
    int ascii;
} JBuf;

static int jb_reserve(JBuf *b, Py_ssize_t extra) {
    if (extra > PY_SSIZE_T_MAX / 2 - b->n) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->n + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    char *np = PyMem_Realloc(b->p, (size_t)cap);
    if (!np) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

static int jb_raw(JBuf *b, const char *text, Py_ssize_t n) {
    if (jb_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->n, text, (size_t)n);
    b->n += n;
    return 0;
}

/* A JSON string literal of UTF-8 text, as json.encoder.encode_basestring writes it. */
static int jb_string(JBuf *b, const char *u, Py_ssize_t len) {
    if (len > PY_SSIZE_T_MAX / 8 || jb_reserve(b, len * 6 + 2) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    char *o = b->p + b->n;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)u[i];
        switch (ch) {
        case '"':
            *o++ = '\\';
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            *o++ = '\\';
            break;
        case '\b':
            *o++ = '\\';
            *o++ = 'b';
            break;
        case '\f':
            *o++ = '\\';
            *o++ = 'f';
            break;
        case '\n':
            *o++ = '\\';
            *o++ = 'n';
            break;
        case '\r':
            *o++ = '\\';
            *o++ = 'r';
            break;
        case '\t':
            *o++ = '\\';
            *o++ = 't';
            break;
        default:
            if (ch < 0x20) {
                static const char hx[] = "0123456789abcdef";
                *o++ = '\\';
                *o++ = 'u';
                *o++ = '0';
                *o++ = '0';
                *o++ = hx[ch >> 4];
                *o++ = hx[ch & 15];
            } else {
                if (ch >= 0x80) b->ascii = 0;
                *o++ = (char)ch;
            }
        }
    }
    *o++ = '"';
    b->n = o - b->p;
    return 0;
}

static int jb_pystring(JBuf *b, PyObject *s) {
    Py_ssize_t len;
    const char *u = PyUnicode_AsUTF8AndSize(s, &len);
    return u ? jb_string(b, u, len) : -1;
}

static PyObject *jb_finish(JBuf *b) {
    PyObject *out = b->ascii ? new_str((const uint8_t *)b->p, b->n) : PyUnicode_DecodeUTF8(b->p, b->n, "strict");
    PyMem_Free(b->p);
    b->p = NULL;
    return out;
}

/* "[" + ",".join(json.encoder.encode_basestring(s) for s in items) + "]" */
static int jb_string_list(JBuf *b, PyObject *list) {
    if (jb_raw(b, "[", 1) < 0) return -1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(list); k++) {
        if (k && jb_raw(b, ",", 1) < 0) return -1;
        if (jb_pystring(b, PyList_GET_ITEM(list, k)) < 0) return -1;
    }
    return jb_raw(b, "]", 1);
}

static PyObject *json_string_list(PyObject *list) {
    JBuf b = {NULL, 0, 0, 1};
    if (jb_string_list(&b, list) < 0) {
        PyMem_Free(b.p);
        return NULL;
    }
    return jb_finish(&b);
}

/* The list any_value builds for an array of strings: truncated items, then a marker. */
static PyObject *array_items(Ctx *c, const Attr *a) {
    Py_ssize_t keep = a->nitems < c->max_items ? a->nitems : c->max_items;
    int marker = a->nitems > c->max_items;
    PyObject *list = PyList_New(keep + marker);
    if (!list) return NULL;
    for (Py_ssize_t k = 0; k < keep; k++) {
        const Slice *s = &c->items[a->item0 + k];
        PyObject *item = make_text(c, s->p, s->n);
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, k, item);
    }
    if (marker) {
        PyObject *m = PyUnicode_FromFormat("[truncated %zd items]", a->nitems - c->max_items);
        if (!m) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, keep, m);
    }
    return list;
}

/* A growable list of slices (the parts of a merged message, or the items of one). */
typedef struct {
    Slice *v;
    Py_ssize_t n, cap;
} SliceVec;

static int sv_push(SliceVec *sv, Slice s) {
    if (sv->n >= sv->cap) {
        Py_ssize_t cap = sv->cap ? sv->cap * 2 : 8;
        Slice *nv = PyMem_Realloc(sv->v, (size_t)cap * sizeof(Slice));
        if (!nv) {
            PyErr_NoMemory();
            return -1;
        }
        sv->v = nv;
        sv->cap = cap;
    }
    sv->v[sv->n++] = s;
    return 0;
}

static int wire_error(void) {
    PyErr_SetString(PyExc_SystemError, "_otlpfast: wire data changed between passes");
    return -1;
}

/* The repeated field 1 (values) of an ArrayValue / KeyValueList, appended to out. */
static int collect_values(Slice m, SliceVec *out) {
    const uint8_t *p = m.p, *end = m.p + m.n;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        if (rd_tag(&p, end, &f, &wt)) return wire_error();
        if (f == 1 && wt == 2) {
            if (rd_len(&p, end, &s)) return wire_error();
            if (sv_push(out, s) < 0) return -1;
        } else if (skip_field(&p, end, f, wt, 0)) {
            return wire_error();
        }
    }
    return 0;
}

static PyObject *build_any(Ctx *c, const Slice *parts, Py_ssize_t nparts, int depth);

/* One KeyValue of a kvlist into dict (last duplicate wins, as a dict comprehension does). */
static int build_kv(Ctx *c, Slice m, PyObject *dict, int depth) {
    SliceVec values = {NULL, 0, 0};
    Slice key = {NULL, 0};
    const uint8_t *p = m.p, *end = m.p + m.n;
    int rc = -1;
    while (p < end) {
        uint32_t f;
        int wt;
        Slice s;
        if (rd_tag(&p, end, &f, &wt)) {
            wire_error();
            goto done;
        }
        if (f == 1 && wt == 2) {
            if (rd_len(&p, end, &key)) {
                wire_error();
                goto done;
            }
        } else if (f == 2 && wt == 2) {
            if (rd_len(&p, end, &s)) {
                wire_error();
                goto done;
            }
            if (sv_push(&values, s) < 0) goto done;
        } else if (skip_field(&p, end, f, wt, 0)) {
            wire_error();
            goto done;
        }
    }
    PyObject *k = make_text(c, key.p, key.n);
    if (!k) goto done;
    PyObject *v = build_any(c, values.v, values.n, depth);
    if (!v) {
        Py_DECREF(k);
        goto done;
    }
    rc = PyDict_SetItem(dict, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
done:
    PyMem_Free(values.v);
    return rc;
}

/* collector.decode.any_value of the AnyValue made of these parts (a merged message). */
static PyObject *build_any(Ctx *c, const Slice *parts, Py_ssize_t nparts, int depth) {
    int kind = AK_NONE;
    Slice str = {NULL, 0};
    uint64_t v = 0;
    SliceVec sub = {NULL, 0, 0}; /* array items or kvlist entries */
    PyObject *out = NULL;
    for (Py_ssize_t part = 0; part < nparts; part++) {
        const uint8_t *p = parts[part].p, *end = p + parts[part].n;
        while (p < end) {
            uint32_t f;
            int wt;
            Slice s;
            int bad = rd_tag(&p, end, &f, &wt);
            if (!bad && f == 1 && wt == 2) {
                bad = rd_len(&p, end, &str);
                kind = AK_STR;
            } else if (!bad && f == 2 && wt == 0) {
                bad = rd_varint(&p, end, &v);
                kind = AK_BOOL;
            } else if (!bad && f == 3 && wt == 0) {
                bad = rd_varint(&p, end, &v);
                kind = AK_INT;
            } else if (!bad && f == 4 && wt == 1) {
                bad = rd_fixed64(&p, end, &v);
                kind = AK_DOUBLE;
            } else if (!bad && (f == 5 || f == 6) && wt == 2) {
                int k = f == 5 ? AK_ARRAY : AK_UNSUP;
                bad = rd_len(&p, end, &s);
                if (!bad) {
                    if (kind != k) sub.n = 0; /* a new oneof member; the same one merges */
                    kind = k;
                    if (collect_values(s, &sub) < 0) goto done;
                }
            } else if (!bad && f == 7 && wt == 2) {
                bad = rd_len(&p, end, &str);
                kind = AK_BYTES;
            } else if (!bad && f == 8 && wt == 0) {
                bad = rd_varint(&p, end, &v);
                kind = AK_NONE;
            } else if (!bad) {
                bad = skip_field(&p, end, f, wt, 0);
            }
            if (bad) {
                wire_error();
                goto done;
            }
        }
    }
    switch (kind) {
    case AK_STR:
        out = make_text(c, str.p, str.n);
        break;
    case AK_BOOL:
        out = v ? Py_True : Py_False;
        Py_INCREF(out);
        break;
    case AK_INT:
        out = PyLong_FromLongLong((long long)(int64_t)v);
        break;
    case AK_DOUBLE: {
        double d;
        memcpy(&d, &v, 8);
        if (isfinite(d))
            out = PyFloat_FromDouble(d);
        else
            out = PyUnicode_FromString(isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf"));
        break;
    }
    case AK_BYTES:
        out = b64_str(str.p, str.n < c->max_bytes ? str.n : c->max_bytes);
        break;
    case AK_ARRAY:
    case AK_UNSUP:
        if (depth >= c->max_depth) {
            out = PyUnicode_FromFormat("[truncated: nesting deeper than %zd]", c->max_depth);
            break;
        }
        if (kind == AK_ARRAY) {
            Py_ssize_t keep = sub.n < c->max_items ? sub.n : c->max_items;
            int marker = sub.n > c->max_items;
            out = PyList_New(keep + marker);
            for (Py_ssize_t k = 0; out && k < keep; k++) {
                PyObject *item = build_any(c, &sub.v[k], 1, depth + 1);
                if (!item) {
                    Py_CLEAR(out);
                    break;
                }
                PyList_SET_ITEM(out, k, item);
            }
            if (out && marker) {
                PyObject *m = PyUnicode_FromFormat("[truncated %zd items]", sub.n - c->max_items);
                if (!m)
                    Py_CLEAR(out);
                else
                    PyList_SET_ITEM(out, keep, m);
            }
        } else {
            out = PyDict_New();
            for (Py_ssize_t k = 0; out && k < sub.n && k < c->max_items; k++)
                if (build_kv(c, sub.v[k], out, depth + 1) < 0) Py_CLEAR(out);
        }
        break;
    default:
        out = Py_None;
        Py_INCREF(out);
    }
done:
    PyMem_Free(sub.v);
    return out;
}

/* json.dumps(value, ensure_ascii=False, separators=(",", ":")) */
static PyObject *json_dumps(PyObject *value) {
    PyObject *args = PyTuple_Pack(1, value);
    if (!args) return NULL;
    PyObject *out = PyObject_Call(g_json_dumps, args, g_json_kwargs);
    Py_DECREF(args);
    return out;
}

/* The attribute's text in the attribute map (new ref in *map), as _as_string_map writes it. */
static int attr_text(Ctx *c, const Attr *a, PyObject **map) {
    PyObject *m = NULL;
    char num[32];
    switch (a->kind) {
    case AK_STR:
        m = make_text(c, a->s.p, a->s.n);
        break;
    case AK_BYTES: {
        Py_ssize_t n = a->s.n < c->max_bytes ? a->s.n : c->max_bytes;
        m = b64_str(a->s.p, n);
        break;
    }
    case AK_NONE:
        m = S_empty;
        Py_INCREF(m);
        break;
    case AK_BOOL:
        m = a->i ? S_true : S_false;
        Py_INCREF(m);
        break;
    case AK_INT: {
        int len = snprintf(num, sizeof num, "%lld", (long long)a->i);
        m = new_str((const uint8_t *)num, len);
        break;
    }
    case AK_DOUBLE:
        if (isfinite(a->d)) {
            PyObject *f = PyFloat_FromDouble(a->d);
            if (!f) return -1;
            m = PyObject_Repr(f);
            Py_DECREF(f);
        } else {
            /* str(float): "nan", "inf" or "-inf" */
            m = PyUnicode_FromString(isnan(a->d) ? "nan" : (a->d > 0 ? "inf" : "-inf"));
        }
        break;
    case AK_ARRAY: {
        PyObject *list = array_items(c, a);
        if (!list) return -1;
        m = json_string_list(list);
        Py_DECREF(list);
        break;
    }
    case AK_COMPLEX: {
        PyObject *value = build_any(c, &a->val, 1, 0);
        if (!value) return -1;
        /* a str when max_depth is 0; lists and dicts otherwise (_as_string_map) */
        if (PyUnicode_CheckExact(value)) {
            m = value;
            Py_INCREF(m);
        } else {
            m = json_dumps(value);
        }
        Py_DECREF(value);
        break;
    }
    default:
        PyErr_SetString(PyExc_SystemError, "_otlpfast: unexpected attribute kind");
        return -1;
    }
    if (!m) return -1;
    *map = m;
    return 0;
}

/* An attribute's key as a str (new ref). */
static PyObject *attr_key(Ctx *c, const Attr *a) { return cached_str(c, a->key.p, a->key.n, a->h); }

static PyObject *array_items(Ctx *c, const Attr *a);

/* json.dumps of one value of attributes_to_dict (the kinds check_attrs lets through). */
static int jb_value(Ctx *c, JBuf *b, const Attr *a) {
    char num[32];
    int len;
    PyObject *tmp;
    int rc;
    switch (a->kind) {
    case AK_STR:
        if (!(tmp = make_text(c, a->s.p, a->s.n))) return -1;
        rc = jb_pystring(b, tmp);
        Py_DECREF(tmp);
        return rc;
    case AK_BYTES:
        if (!(tmp = b64_str(a->s.p, a->s.n < c->max_bytes ? a->s.n : c->max_bytes))) return -1;
        rc = jb_pystring(b, tmp);
        Py_DECREF(tmp);
        return rc;
    case AK_NONE:
        return jb_raw(b, "null", 4);
    case AK_BOOL:
        return a->i ? jb_raw(b, "true", 4) : jb_raw(b, "false", 5);
    case AK_INT:
        len = snprintf(num, sizeof num, "%lld", (long long)a->i);
        return jb_raw(b, num, len);
    case AK_DOUBLE:
        if (!isfinite(a->d)) /* any_value made it the text str(number) */
            return isnan(a->d) ? jb_raw(b, "\"nan\"", 5) : a->d > 0 ? jb_raw(b, "\"inf\"", 5) : jb_raw(b, "\"-inf\"", 6);
        {
            PyObject *f = PyFloat_FromDouble(a->d);
            if (!f) return -1;
            tmp = PyObject_Repr(f);
            Py_DECREF(f);
            if (!tmp) return -1;
            Py_ssize_t n;
            const char *u = PyUnicode_AsUTF8AndSize(tmp, &n);
            rc = u ? jb_raw(b, u, n) : -1;
            Py_DECREF(tmp);
            return rc;
        }
    case AK_ARRAY:
        if (!(tmp = array_items(c, a))) return -1;
        rc = jb_string_list(b, tmp);
        Py_DECREF(tmp);
        return rc;
    case AK_COMPLEX: {
        PyObject *value = build_any(c, &a->val, 1, 0);
        if (!value) return -1;
        tmp = json_dumps(value);
        Py_DECREF(value);
        if (!tmp) return -1;
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(tmp, &n);
        if (u && !is_ascii((const uint8_t *)u, n)) b->ascii = 0;
        rc = u ? jb_raw(b, u, n) : -1;
        Py_DECREF(tmp);
        return rc;
    }
    default:
        PyErr_SetString(PyExc_SystemError, "_otlpfast: unexpected attribute kind");
        return -1;
    }
}

/* json.dumps of attributes_to_dict(attributes): keys are plain (check_attrs). */
static int jb_attributes(Ctx *c, JBuf *b, const Attr *attrs, Py_ssize_t n) {
    if (jb_raw(b, "{", 1) < 0) return -1;
    int first = 1;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (attrs[k].skip) continue;
        if (!first && jb_raw(b, ",", 1) < 0) return -1;
        first = 0;
        if (jb_string(b, (const char *)attrs[k].key.p, attrs[k].key.n) < 0 || jb_raw(b, ":", 1) < 0 ||
            jb_value(c, b, &attrs[attrs[k].use]) < 0)
            return -1;
    }
    return jb_raw(b, "}", 1);
}

static int jb_hex(JBuf *b, const Slice *s) {
    static const char digits[] = "0123456789abcdef";
    if (s->n > PY_SSIZE_T_MAX / 4 || jb_reserve(b, s->n * 2 + 2) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    char *o = b->p + b->n;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < s->n; i++) {
        *o++ = digits[s->p[i] >> 4];
        *o++ = digits[s->p[i] & 15];
    }
    *o++ = '"';
    b->n = o - b->p;
    return 0;
}

/* collector.decode._events_json / _links_json of an accepted span. */
static PyObject *events_json(Ctx *c, const Span *sp, int links) {
    JBuf b = {NULL, 0, 0, 1};
    Py_ssize_t written = 0;
    char num[32];
    if (jb_raw(&b, "[", 1) < 0) goto fail;
    for (Py_ssize_t k = sp->e0; k < sp->e0 + sp->ne && written < c->max_items; k++) {
        const Event *ev = &c->events[k];
        if (ev->is_link != links) continue;
        if (written++ && jb_raw(&b, ",", 1) < 0) goto fail;
        if (links) {
            if (jb_raw(&b, "{\"TraceId\":", 11) < 0 || jb_hex(&b, &ev->tid) < 0 ||
                jb_raw(&b, ",\"SpanId\":", 10) < 0 || jb_hex(&b, &ev->sid) < 0 ||
                jb_raw(&b, ",\"TraceState\":", 14) < 0 ||
                jb_string(&b, (const char *)ev->tstate.p, ev->tstate.n) < 0)
                goto fail;
        } else {
            int len = snprintf(num, sizeof num, "%llu", (unsigned long long)ev->time);
            PyObject *name = make_text(c, ev->name.p, ev->name.n);
            if (!name) goto fail;
            int rc = jb_raw(&b, "{\"Timestamp\":", 13) < 0 || jb_raw(&b, num, len) < 0 ||
                     jb_raw(&b, ",\"Name\":", 8) < 0 || jb_pystring(&b, name) < 0;
            Py_DECREF(name);
            if (rc) goto fail;
        }
        if (jb_raw(&b, ",\"Attributes\":", 14) < 0 || jb_attributes(c, &b, c->eattrs + ev->a0, ev->na) < 0 ||
            jb_raw(&b, "}", 1) < 0)
            goto fail;
    }
    if (jb_raw(&b, "]", 1) < 0) goto fail;
    return jb_finish(&b);
fail:
    PyMem_Free(b.p);
    return NULL;
}

/* The Events or Links column of an accepted span (new ref). */
static PyObject *events_column(Ctx *c, const Span *sp, int links) {
    int any = 0;
    for (Py_ssize_t k = sp->e0; k < sp->e0 + sp->ne; k++) any |= c->events[k].is_link == links;
    if (!any) {
        Py_INCREF(S_brackets);
        return S_brackets;
    }
    return events_json(c, sp, links);
}

static PyObject *reject_message(const Ctx *c, const Span *sp) {
    PyObject *name = new_str(sp->name.p, sp->name.n);
    if (!name) return NULL;
    PyObject *head = PyUnicode_Substring(name, 0, 60);
    Py_DECREF(name);
    if (!head) return NULL;
    PyObject *r = PyObject_Repr(head);
    Py_DECREF(head);
    if (!r) return NULL;
    PyObject *msg = NULL;
    switch (sp->reason) {
    case REASON_TRACE_ID:
        msg = PyUnicode_FromFormat("span %U: trace_id must be 16 non-zero bytes, got %zd bytes", r, sp->tid.n);
        break;
    case REASON_SPAN_ID:
        msg = PyUnicode_FromFormat("span %U: span_id must be 8 non-zero bytes, got %zd bytes", r, sp->sid.n);
        break;
    case REASON_PARENT:
        msg = PyUnicode_FromFormat("span %U: parent_span_id must be empty or 8 bytes, got %zd bytes", r,
                                   sp->pid.n);
        break;
    case REASON_START_ZERO:
        msg = PyUnicode_FromFormat("span %U: start_time_unix_nano is 0 (unset)", r);
        break;
    case REASON_OVERFLOW:
        msg = PyUnicode_FromFormat("span %U: timestamp beyond year 2262 (nanoseconds overflow int64)", r);
        break;
    case REASON_TOO_MANY_ATTRS:
        msg = PyUnicode_FromFormat("span %U: more than %zd attributes on the span, one of its events or links, "
                                   "or its resource (max_attributes_per_span)",
                                   r, c->max_attrs);
        break;
    default:
        msg = PyUnicode_FromFormat("span %U: end_time_unix_nano %llu is before start_time_unix_nano %llu", r,
                                   (unsigned long long)sp->end, (unsigned long long)sp->start);
    }
    Py_DECREF(r);
    return msg;
}

#define N_OTEL 17
enum {
    O_TIMESTAMP,
    O_TRACE_ID,
    O_SPAN_ID,
    O_PARENT,
    O_TRACE_STATE,
    O_NAME,
    O_KIND,
    O_SERVICE,
    O_SCOPE_NAME,
    O_SCOPE_VERSION,
    O_DURATION,
    O_STATUS_CODE,
    O_STATUS_MESSAGE,
    O_EVENTS,
    O_LINKS,
    O_START,
    O_END
};

typedef struct {
    PyObject *otel[N_OTEL];
    PyObject *soff, *skeys, *svals, *roff, *rkeys, *rvals, *errors;
    /* per resource */
    PyObject **rkey_obj, **rval_obj; /* nrattrs each */
    PyObject **service;              /* nres */
    PyObject **scope_obj;            /* nscopes * 2 */
} Out;

static void out_free(Ctx *c, Out *o) {
    for (int k = 0; k < N_OTEL; k++) Py_XDECREF(o->otel[k]);
    Py_XDECREF(o->soff);
    Py_XDECREF(o->skeys);
    Py_XDECREF(o->svals);
    Py_XDECREF(o->roff);
    Py_XDECREF(o->rkeys);
    Py_XDECREF(o->rvals);
    Py_XDECREF(o->errors);
    if (o->rkey_obj) {
        for (Py_ssize_t k = 0; k < c->nrattrs; k++) {
            Py_XDECREF(o->rkey_obj[k]);
            Py_XDECREF(o->rval_obj[k]);
        }
    }
    if (o->service)
        for (Py_ssize_t k = 0; k < c->nres; k++) Py_XDECREF(o->service[k]);
    if (o->scope_obj)
        for (Py_ssize_t k = 0; k < c->nscopes * 2; k++) Py_XDECREF(o->scope_obj[k]);
    PyMem_Free(o->rkey_obj);
    PyMem_Free(o->rval_obj);
    PyMem_Free(o->service);
    PyMem_Free(o->scope_obj);
}

static PyObject **calloc_objs(Py_ssize_t n) {
    PyObject **p = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *));
    if (!p) PyErr_NoMemory();
    return p;
}

/* Per resource: its keys and texts, and its service name (the `service.name` string, an
   OpenTelemetry column, not a convention). */
static int build_resources(Ctx *c, Out *o) {
    static const char SERVICE_KEY[] = "service.name";
    if (!(o->rkey_obj = calloc_objs(c->nrattrs)) || !(o->rval_obj = calloc_objs(c->nrattrs)) ||
        !(o->service = calloc_objs(c->nres)))
        return -1;
    for (Py_ssize_t r = 0; r < c->nres; r++) {
        const Res *res = &c->res[r];
        for (Py_ssize_t k = res->a0; k < res->a0 + res->n; k++) {
            const Attr *a = &c->rattrs[k];
            if (a->skip) continue; /* rkey_obj[k] stays NULL */
            if (!(o->rkey_obj[k] = attr_key(c, a))) return -1;
            const Attr *value = &c->rattrs[res->a0 + a->use];
            if (attr_text(c, value, &o->rval_obj[k]) < 0) return -1;
            if (a->key.n == (Py_ssize_t)(sizeof SERVICE_KEY - 1) &&
                memcmp(a->key.p, SERVICE_KEY, sizeof SERVICE_KEY - 1) == 0) {
                PyObject *svc = value->kind == AK_STR ? o->rval_obj[k] : NULL;
                Py_XINCREF(svc);
                Py_XSETREF(o->service[r], svc);
            }
        }
        PyObject *svc = o->service[r];
        if (!(svc && PyUnicode_GET_LENGTH(svc) > 0)) {
            Py_INCREF(S_unknown_service);
            Py_XSETREF(o->service[r], S_unknown_service);
        }
    }
    return 0;
}

static inline int set_long(PyObject *list, Py_ssize_t j, PyObject *v) {
    if (!v) return -1;
    PyList_SET_ITEM(list, j, v);
    return 0;
}

static PyObject *build(Ctx *c) {
    Out o;
    memset(&o, 0, sizeof o);
    PyObject *result = NULL;
    PyObject *last_tid = NULL, *last_pid = NULL;
    const uint8_t *last_tid_p = NULL, *last_pid_p = NULL;

    Py_ssize_t n = 0, nspairs = 0, nrpairs = 0, rejected = 0;
    for (Py_ssize_t s = 0; s < c->nspans; s++) {
        const Span *sp = &c->spans[s];
        if (sp->reason) {
            rejected++;
            continue;
        }
        n++;
        nspairs += sp->nuniq;
        nrpairs += c->res[c->scopes[sp->scope].res].nuniq;
    }
    for (int k = 0; k < N_OTEL; k++)
        if (!(o.otel[k] = PyList_New(n))) goto fail;
    if (!(o.soff = PyList_New(n + 1)) || !(o.skeys = PyList_New(nspairs)) || !(o.svals = PyList_New(nspairs)) ||
        !(o.roff = PyList_New(n + 1)) || !(o.rkeys = PyList_New(nrpairs)) || !(o.rvals = PyList_New(nrpairs)) ||
        !(o.errors = PyList_New(0)))
        goto fail;
    if (build_resources(c, &o) < 0) goto fail;
    if (!(o.scope_obj = calloc_objs(c->nscopes * 2))) goto fail;
    for (Py_ssize_t k = 0; k < c->nscopes; k++) {
        if (!(o.scope_obj[2 * k] = make_text(c, c->scopes[k].name.p, c->scopes[k].name.n))) goto fail;
        if (!(o.scope_obj[2 * k + 1] = make_text(c, c->scopes[k].version.p, c->scopes[k].version.n))) goto fail;
    }
    PyObject *zero = PyLong_FromLong(0);
    if (!zero) goto fail;
    PyList_SET_ITEM(o.soff, 0, zero);
    Py_INCREF(zero);
    PyList_SET_ITEM(o.roff, 0, zero);

    Py_ssize_t j = 0, sp_pos = 0, rp_pos = 0;
    for (Py_ssize_t s = 0; s < c->nspans; s++) {
        const Span *sp = &c->spans[s];
        if (sp->reason) {
            PyObject *msg = reject_message(c, sp);
            if (!msg) goto fail;
            int rc = PyList_Append(o.errors, msg);
            Py_DECREF(msg);
            if (rc < 0) goto fail;
            continue;
        }
        const Scope *scope = &c->scopes[sp->scope];
        Py_ssize_t r = scope->res;
        PyObject *v;
        /* OTel columns */
        if (set_long(o.otel[O_TIMESTAMP], j, PyLong_FromUnsignedLongLong(sp->start / 1000)) < 0) goto fail;
        if (!last_tid || memcmp(last_tid_p, sp->tid.p, 16) != 0) {
            Py_XDECREF(last_tid);
            if (!(last_tid = hex_str(sp->tid.p, 16))) goto fail;
            last_tid_p = sp->tid.p;
        }
        Py_INCREF(last_tid);
        PyList_SET_ITEM(o.otel[O_TRACE_ID], j, last_tid);
        if (!(v = hex_str(sp->sid.p, 8))) goto fail;
        PyList_SET_ITEM(o.otel[O_SPAN_ID], j, v);
        if (sp->pid.n == 0) {
            v = S_empty;
            Py_INCREF(v);
        } else {
            if (!last_pid || memcmp(last_pid_p, sp->pid.p, 8) != 0) {
                Py_XDECREF(last_pid);
                if (!(last_pid = hex_str(sp->pid.p, 8))) goto fail;
                last_pid_p = sp->pid.p;
            }
            v = last_pid;
            Py_INCREF(v);
        }
        PyList_SET_ITEM(o.otel[O_PARENT], j, v);
        if (sp->tstate.n <= CACHE_MAX_LEN)
            v = cached_str(c, sp->tstate.p, sp->tstate.n, hash_bytes(sp->tstate.p, sp->tstate.n));
        else
            v = new_str(sp->tstate.p, sp->tstate.n); /* trace_state is not truncated */
        if (!v) goto fail;
        PyList_SET_ITEM(o.otel[O_TRACE_STATE], j, v);
        if (!(v = make_text(c, sp->name.p, sp->name.n))) goto fail;
        PyList_SET_ITEM(o.otel[O_NAME], j, v);
        v = (sp->kind >= 0 && sp->kind < 6) ? S_kinds[sp->kind] : S_kinds[0];
        Py_INCREF(v);
        PyList_SET_ITEM(o.otel[O_KIND], j, v);
        v = o.service[r];
        Py_INCREF(v);
        PyList_SET_ITEM(o.otel[O_SERVICE], j, v);
        v = o.scope_obj[2 * sp->scope];
        Py_INCREF(v);
        PyList_SET_ITEM(o.otel[O_SCOPE_NAME], j, v);
        v = o.scope_obj[2 * sp->scope + 1];
        Py_INCREF(v);
        PyList_SET_ITEM(o.otel[O_SCOPE_VERSION], j, v);
        if (set_long(o.otel[O_DURATION], j, PyLong_FromUnsignedLongLong(sp->end - sp->start)) < 0) goto fail;
        v = (sp->code >= 0 && sp->code < 3) ? S_codes[sp->code] : S_codes[0];
        Py_INCREF(v);
        PyList_SET_ITEM(o.otel[O_STATUS_CODE], j, v);
        if (!(v = make_text(c, sp->smsg.p, sp->smsg.n))) goto fail;
        PyList_SET_ITEM(o.otel[O_STATUS_MESSAGE], j, v);
        if (!(v = events_column(c, sp, 0))) goto fail;
        PyList_SET_ITEM(o.otel[O_EVENTS], j, v);
        if (!(v = events_column(c, sp, 1))) goto fail;
        PyList_SET_ITEM(o.otel[O_LINKS], j, v);
        if (set_long(o.otel[O_START], j, PyLong_FromUnsignedLongLong(sp->start)) < 0) goto fail;
        if (set_long(o.otel[O_END], j, PyLong_FromUnsignedLongLong(sp->end)) < 0) goto fail;

        /* span attributes */
        for (Py_ssize_t k = 0; k < sp->na; k++) {
            const Attr *a = &c->attrs[sp->a0 + k];
            if (a->skip) continue;
            PyObject *key = attr_key(c, a), *map;
            if (!key) goto fail;
            PyList_SET_ITEM(o.skeys, sp_pos, key);
            if (attr_text(c, &c->attrs[sp->a0 + a->use], &map) < 0) goto fail;
            PyList_SET_ITEM(o.svals, sp_pos, map);
            sp_pos++;
        }
        if (set_long(o.soff, j + 1, PyLong_FromSsize_t(sp_pos)) < 0) goto fail;
        /* resource attributes, repeated per span */
        const Res *res = &c->res[r];
        for (Py_ssize_t k = res->a0; k < res->a0 + res->n; k++) {
            if (!o.rkey_obj[k]) continue; /* a duplicate key */
            Py_INCREF(o.rkey_obj[k]);
            PyList_SET_ITEM(o.rkeys, rp_pos, o.rkey_obj[k]);
            Py_INCREF(o.rval_obj[k]);
            PyList_SET_ITEM(o.rvals, rp_pos, o.rval_obj[k]);
            rp_pos++;
        }
        if (set_long(o.roff, j + 1, PyLong_FromSsize_t(rp_pos)) < 0) goto fail;
        j++;
    }

    {
        PyObject *otel = PyTuple_New(N_OTEL);
        if (!otel) goto fail;
        for (int k = 0; k < N_OTEL; k++) {
            PyTuple_SET_ITEM(otel, k, o.otel[k]);
            o.otel[k] = NULL;
        }
        result = Py_BuildValue("(N(OOO)(OOO)nnO)", otel, o.soff, o.skeys, o.svals, o.roff, o.rkeys,
                               o.rvals, n, rejected, o.errors);
    }
fail:
    Py_XDECREF(last_tid);
    Py_XDECREF(last_pid);
    out_free(c, &o);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* Module functions                                                                           */
/* ------------------------------------------------------------------------------------------ */

static void ctx_free(Ctx *c) {
    PyMem_RawFree(c->attrs);
    PyMem_RawFree(c->rattrs);
    PyMem_RawFree(c->items);
    PyMem_RawFree(c->spans);
    PyMem_RawFree(c->events);
    PyMem_RawFree(c->eattrs);
    PyMem_RawFree(c->scopes);
    PyMem_RawFree(c->res);
    if (c->cache) {
        for (Py_ssize_t k = 0; k < CACHE_SIZE; k++) Py_XDECREF(c->cache[k].s);
        PyMem_Free(c->cache);
    }
    PyMem_Free(c->buf);
}

static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *payload;
    Py_ssize_t max_bytes, max_items, max_depth, max_spans, max_attrs, max_work;
    if (!PyArg_ParseTuple(args, "O!nnnnnn:decode", &PyBytes_Type, &payload, &max_bytes, &max_items, &max_depth,
                          &max_spans, &max_attrs, &max_work))
        return NULL;
    if (max_bytes < 0 || max_items < 0 || max_depth < 1 || max_spans < 0 || max_attrs < 0 || max_work < 0) {
        PyErr_SetString(PyExc_ValueError, "limits must not be negative (max_depth at least 1)");
        return NULL;
    }
    Ctx c;
    memset(&c, 0, sizeof c);
    c.max_bytes = max_bytes;
    c.max_items = max_items;
    c.max_depth = max_depth;
    c.max_spans = max_spans;
    c.max_attrs = max_attrs;
    c.max_work = max_work;
    const uint8_t *data = (const uint8_t *)PyBytes_AS_STRING(payload);
    Py_ssize_t n = PyBytes_GET_SIZE(payload);
    int rc;
    if (n >= INT32_MAX) {
        rc = FALLBACK;
    } else {
        /* `payload` is an immutable bytes object we hold a reference to. */
        Py_BEGIN_ALLOW_THREADS
        rc = parse_request(&c, data, n);
        Py_END_ALLOW_THREADS
    }
    PyObject *result = NULL;
    if (rc == LIMIT) {
        result = PyUnicode_FromString(c.limit == LIMIT_SPANS ? "spans" : "items");
    } else if (rc == NOMEM) {
        PyErr_NoMemory();
    } else if (rc == FALLBACK) {
        result = Py_None;
        Py_INCREF(result);
    } else {
        c.cache = PyMem_Calloc(CACHE_SIZE, sizeof(CacheEnt));
        if (!c.cache)
            PyErr_NoMemory();
        else
            result = build(&c);
    }
    ctx_free(&c);
    return result;
}

/* ---- two loops of the batch mapping (collector.mapping_plans), for any decoder's triple ---- */

/* offsets[i] as an index into a list of `limit` items (-1 with an exception set when it is not). */
static int offset_at(PyObject *offsets, Py_ssize_t i, Py_ssize_t limit, Py_ssize_t *out) {
    if (i >= PyList_GET_SIZE(offsets)) {
        PyErr_SetString(PyExc_ValueError, "attribute offsets changed size");
        return -1;
    }
    Py_ssize_t v = PyLong_AsSsize_t(PyList_GET_ITEM(offsets, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v > limit) {
        PyErr_SetString(PyExc_ValueError, "attribute offsets out of range");
        return -1;
    }
    *out = v;
    return 0;
}

/* group_rows(offsets, keys, scopes) -> {(scope, key tuple) or key tuple: [row, ...]}: the rows
   (spans) by their attribute keys in order, with their scope unless scopes is None. */
static PyObject *group_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *offsets, *keys, *scopes;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &offsets, &PyList_Type, &keys, &scopes)) return NULL;
    if (scopes != Py_None && !PyList_Check(scopes)) {
        PyErr_SetString(PyExc_TypeError, "scopes must be a list or None");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(offsets) - 1;
    if (scopes != Py_None && PyList_GET_SIZE(scopes) < n) {
        PyErr_SetString(PyExc_ValueError, "fewer scopes than rows");
        return NULL;
    }
    PyObject *groups = PyDict_New();
    if (!groups) return NULL;
    Py_ssize_t a = 0, b;
    if (n > 0 && offset_at(offsets, 0, PyList_GET_SIZE(keys), &a) < 0) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (offset_at(offsets, i + 1, PyList_GET_SIZE(keys), &b) < 0) goto fail;
        if (b < a) {
            PyErr_SetString(PyExc_ValueError, "attribute offsets decrease");
            goto fail;
        }
        PyObject *key = PyTuple_New(b - a);
        if (!key) goto fail;
        for (Py_ssize_t j = a; j < b; j++) {
            PyObject *k = PyList_GET_ITEM(keys, j);
            Py_INCREF(k);
            PyTuple_SET_ITEM(key, j - a, k);
        }
        if (scopes != Py_None) {
            if (i >= PyList_GET_SIZE(scopes)) {
                Py_DECREF(key);
                PyErr_SetString(PyExc_ValueError, "scopes changed size");
                goto fail;
            }
            PyObject *pair = PyTuple_Pack(2, PyList_GET_ITEM(scopes, i), key);
            Py_DECREF(key);
            if (!pair) goto fail;
            key = pair;
        }
        PyObject *rows = PyDict_GetItemWithError(groups, key);
        if (rows) {
            Py_INCREF(rows);
        } else {
            if (PyErr_Occurred() || !(rows = PyList_New(0)) || PyDict_SetItem(groups, key, rows) < 0) {
                Py_XDECREF(rows);
                Py_DECREF(key);
                goto fail;
            }
        }
        Py_DECREF(key);
        PyObject *row = PyLong_FromSsize_t(i);
        int bad = !row || PyList_Append(rows, row) < 0;
        Py_XDECREF(row);
        Py_DECREF(rows);
        if (bad) goto fail;
        a = b;
    }
    return groups;
fail:
    Py_DECREF(groups);
    return NULL;
}

/* copy_columns(offsets, keys, values, direct, cols) -> None: for row i's attributes in order,
   cols[direct[key]][i] = value for every key direct maps (the last of repeated keys wins). */
static PyObject *copy_columns(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *offsets, *keys, *values, *direct, *cols;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!", &PyList_Type, &offsets, &PyList_Type, &keys, &PyList_Type, &values,
                          &PyDict_Type, &direct, &PyList_Type, &cols))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(offsets) - 1;
    Py_ssize_t a = 0, b;
    if (n > 0 && offset_at(offsets, 0, PyList_GET_SIZE(keys), &a) < 0) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (offset_at(offsets, i + 1, PyList_GET_SIZE(keys), &b) < 0) return NULL;
        for (Py_ssize_t j = a; j < b; j++) {
            if (j >= PyList_GET_SIZE(keys)) {
                PyErr_SetString(PyExc_ValueError, "attribute keys changed size");
                return NULL;
            }
            PyObject *k = PyList_GET_ITEM(keys, j);
            Py_INCREF(k);
            PyObject *slot = PyDict_GetItemWithError(direct, k);
            Py_DECREF(k);
            if (!slot) {
                if (PyErr_Occurred()) return NULL;
                continue;
            }
            Py_ssize_t c = PyLong_AsSsize_t(slot);
            if (c == -1 && PyErr_Occurred()) return NULL;
            if (c < 0 || c >= PyList_GET_SIZE(cols) || !PyList_Check(PyList_GET_ITEM(cols, c)) ||
                i >= PyList_GET_SIZE(PyList_GET_ITEM(cols, c)) || j >= PyList_GET_SIZE(values)) {
                PyErr_SetString(PyExc_ValueError, "copy_columns: a column or value out of range");
                return NULL;
            }
            PyObject *value = PyList_GET_ITEM(values, j);
            Py_INCREF(value);
            PyList_SetItem(PyList_GET_ITEM(cols, c), i, value); /* steals value, drops the old item */
        }
        if (b < a) {
            PyErr_SetString(PyExc_ValueError, "attribute offsets decrease");
            return NULL;
        }
        a = b;
    }
    Py_RETURN_NONE;
}

/* utf8_column(items: list | tuple) -> (offsets: bytes, data: bytes, validity: bytes | None, nulls: int)
   The buffers of an Arrow string array of items (each an exact str or None): int32 offsets, the
   UTF-8 text, a validity bitmap when any item is None. None when pa.array must build it: an item
   of another type, a text that is not encodable (lone surrogates), or 2 GiB of text and more. */
static PyObject *utf8_column(PyObject *self, PyObject *items) {
    (void)self;
    if (!PyList_CheckExact(items) && !PyTuple_CheckExact(items)) Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    PyObject **item = PySequence_Fast_ITEMS(items);
    Py_ssize_t total = 0, nulls = 0, len;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (item[i] == Py_None) {
            nulls++;
            continue;
        }
        if (!PyUnicode_CheckExact(item[i])) Py_RETURN_NONE;
        if (!PyUnicode_AsUTF8AndSize(item[i], &len)) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        total += len;
        if (total > INT32_MAX) Py_RETURN_NONE;
    }
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    PyObject *data = PyBytes_FromStringAndSize(NULL, total);
    PyObject *validity = nulls ? PyBytes_FromStringAndSize(NULL, (n + 7) / 8) : Py_None;
    if (!offsets || !data || !validity) goto fail;
    if (nulls) memset(PyBytes_AS_STRING(validity), 0, (size_t)((n + 7) / 8));
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    uint8_t *bits = nulls ? (uint8_t *)PyBytes_AS_STRING(validity) : NULL;
    char *out = PyBytes_AS_STRING(data);
    Py_ssize_t at = 0;
    off[0] = 0;
    /* the items are the ones measured above: nothing ran Python code since (no item's text can change) */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (item[i] != Py_None) {
            const char *text = PyUnicode_AsUTF8AndSize(item[i], &len); /* cached by the first pass */
            if (!text || at + len > total) {
                PyErr_Clear();
                Py_DECREF(offsets);
                Py_DECREF(data);
                if (nulls) Py_DECREF(validity);
                Py_RETURN_NONE;
            }
            memcpy(out + at, text, (size_t)len);
            at += len;
            if (bits) bits[i >> 3] |= (uint8_t)(1u << (i & 7));
        }
        off[i + 1] = (int32_t)at;
    }
    PyObject *result = Py_BuildValue("(NNNn)", offsets, data, validity, nulls);
    if (!nulls) Py_INCREF(Py_None); /* "N" stole the reference we did not own */
    return result;
fail:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    if (nulls) Py_XDECREF(validity);
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(payload: bytes, max_attribute_bytes: int, max_array_items: int, max_depth: int, max_spans: int,\n"
     "       max_attributes_per_span: int, max_items: int) -> tuple | str | None\n"
     "Decode an ExportTraceServiceRequest; None when the Python path must decode it."},
    {"count", count, METH_VARARGS,
     "count(payload: bytes, max_spans: int, max_items: int) -> str | None\n"
     "'spans' or 'items' when the request passes that count (counted without keeping anything), else None."},
    {"group_rows", group_rows, METH_VARARGS,
     "group_rows(offsets: list, keys: list, scopes: list | None) -> dict\n"
     "Rows by their attribute keys (and scope): {(scope, keys) or keys: [row, ...]}, keys a tuple."},
    {"copy_columns", copy_columns, METH_VARARGS,
     "copy_columns(offsets: list, keys: list, values: list, direct: dict, cols: list) -> None\n"
     "cols[direct[key]][row] = value for each row's attributes whose key direct maps, in order."},
    {"utf8_column", utf8_column, METH_O,
     "utf8_column(items: list | tuple) -> tuple | None\n"
     "(offsets, data, validity or None, null count): an Arrow string array's buffers for items that are\n"
     "str or None; None when pa.array must convert them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_otlpfast", "Compiled fast path for OTLP protobuf trace requests.", -1, methods,
    NULL, NULL, NULL, NULL,
};

static PyObject *intern(const char *s) { return PyUnicode_InternFromString(s); }

/* g_hash_seed from os.urandom (a fresh key per process). */
static int seed_hash(void) {
    PyObject *os = PyImport_ImportModule("os");
    if (!os) return -1;
    PyObject *raw = PyObject_CallMethod(os, "urandom", "i", 8);
    Py_DECREF(os);
    if (!raw) return -1;
    if (PyBytes_GET_SIZE(raw) == 8) memcpy(&g_hash_seed, PyBytes_AS_STRING(raw), 8);
    Py_DECREF(raw);
    return 0;
}

PyMODINIT_FUNC PyInit__otlpfast(void) {
    if (seed_hash() < 0) return NULL;
    static const char *kinds[6] = {"Unspecified", "Internal", "Server", "Client", "Producer", "Consumer"};
    static const char *codes[3] = {"Unset", "Ok", "Error"};
    if (!(S_empty = intern("")) || !(S_brackets = intern("[]")) || !(S_true = intern("true")) ||
        !(S_false = intern("false")) || !(S_unknown_service = intern("unknown_service")))
        return NULL;
    PyObject *json = PyImport_ImportModule("json");
    if (!json) return NULL;
    g_json_dumps = PyObject_GetAttrString(json, "dumps");
    Py_DECREF(json);
    if (!g_json_dumps) return NULL;
    g_json_kwargs = Py_BuildValue("{s:O,s:(ss)}", "ensure_ascii", Py_False, "separators", ",", ":");
    if (!g_json_kwargs) return NULL;
    for (int k = 0; k < 6; k++)
        if (!(S_kinds[k] = intern(kinds[k]))) return NULL;
    for (int k = 0; k < 3; k++)
        if (!(S_codes[k] = intern(codes[k]))) return NULL;
    return PyModule_Create(&moduledef);
}
