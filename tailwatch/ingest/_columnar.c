/* Raw JSON records of one wire schema straight into typed Arrow column buffers.
 *
 * The fast path of ingest/columnar.py. It accepts a record only where it can prove the
 * record decodes to exactly what the reference decoder (msgspec with the schema's types,
 * ingest/validate.py) gives: one flat object of known fields, each once, plain ASCII
 * strings without escapes, numbers in the JSON grammar within the field's bounds, literals
 * from the field's closed set, the required fields present. Anything else it declines, and
 * the record goes to the reference decoder, which names any fault: this file never decides
 * that a record is bad, only that it is plainly good. No Python object is made per field;
 * each accepted record is parsed into a scratch row first and written to the columns only
 * once whole, so a record declined half-way leaves no trace.
 *
 * Columns come back as Arrow buffers (validity bitmap, values or offsets and data) in
 * bytes objects, for pyarrow to wrap without a copy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

enum { K_SCHEMA = 0, K_STR = 1, K_INT = 2, K_FLOAT = 3, K_BOOL = 4, K_TS = 5, K_DECLINE = 6 };
enum { C_NONE = 0, C_I32 = 1, C_I64 = 2, C_F64 = 3, C_BOOL = 4, C_STR = 5 };
enum { D_REQUIRED = 0, D_NULL = 1, D_VALUE = 2 };
enum { S_ABSENT = 0, S_NULL = 1, S_VALUE = 2 };

#define MAX_FIELDS 64
#define HASH_SLOTS 256
#define MAX_ENUM 16
#define MAX_NUMBER_CHARS 48

/* Values of a patterned field that the reference decoder accepted: the fast decoder takes a
 * value it finds here and declines any other, so a pattern is never judged here. Bounded:
 * past MAX_APPROVED values no more are added (the rest keep going to the reference). */
#define MAX_APPROVED 4096
#define APPROVED_SLOTS 8192

typedef struct ValueSet {
    Py_ssize_t n;
    uint64_t hash[APPROVED_SLOTS];
    char *value[APPROVED_SLOTS];
    Py_ssize_t len[APPROVED_SLOTS];
} ValueSet;

static uint64_t value_hash(const char *s, Py_ssize_t n) {
    uint64_t h = 14695981039346656037ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h | 1; /* 0 marks an empty slot */
}

static int approved(const ValueSet *set, const char *s, Py_ssize_t n) {
    uint64_t h = value_hash(s, n);
    for (size_t i = h & (APPROVED_SLOTS - 1);; i = (i + 1) & (APPROVED_SLOTS - 1)) {
        if (set->hash[i] == 0) return 0;
        if (set->hash[i] == h && set->len[i] == n && memcmp(set->value[i], s, n) == 0) return 1;
    }
}

static int approve(ValueSet *set, const char *s, Py_ssize_t n) {
    if (set->n >= MAX_APPROVED || approved(set, s, n)) return 0;
    uint64_t h = value_hash(s, n);
    size_t i = h & (APPROVED_SLOTS - 1);
    while (set->hash[i] != 0) i = (i + 1) & (APPROVED_SLOTS - 1);
    char *copy = PyMem_Malloc(n ? n : 1);
    if (copy == NULL) { PyErr_NoMemory(); return -1; }
    memcpy(copy, s, n);
    set->hash[i] = h;
    set->value[i] = copy;
    set->len[i] = n;
    set->n++;
    return 0;
}

static void free_set(ValueSet *set) {
    if (set == NULL) return;
    for (size_t i = 0; i < APPROVED_SLOTS; i++)
        if (set->hash[i]) PyMem_Free(set->value[i]);
    PyMem_Free(set);
}

typedef struct {
    const char *name;
    Py_ssize_t name_len;
    int kind, nullable, dflt, ctype;
    int column; /* output column, -1: validated, not kept */
    Py_ssize_t min_len, max_len;
    long long imin, imax; /* inclusive */
    double fmin, fmax;    /* inclusive */
    int fold_case; /* ASCII letters kept lower-case (a case-insensitive label) */
    struct ValueSet *approved; /* a patterned field: values the reference has accepted, else NULL */
    int n_enum;
    const char *enum_val[MAX_ENUM];
    Py_ssize_t enum_len[MAX_ENUM];
    long long idef;
    double fdef;
    int bdef;
    const char *sdef;
    Py_ssize_t sdef_len;
} Field;

typedef struct {
    int state;
    long long i;
    double f;
    const char *s;
    Py_ssize_t slen;
} Slot;

typedef struct {
    PyObject_HEAD
    int n_fields, n_columns;
    Field fields[MAX_FIELDS];
    int column_field[MAX_FIELDS]; /* column → its field */
    signed char slot_of[HASH_SLOTS];
    /* The field that followed each field (the last entry: the first field) in the last record
     * where it was looked up: a producer writes its fields in one order, so the next key is
     * nearly always the one predicted and is compared in place, without a scan or a hash. */
    signed char next_after[MAX_FIELDS + 1];
    uint64_t required;
    Py_ssize_t max_record_bytes;
    PyObject *keep; /* the spec: it owns every name, literal and default the fields point at */
} Decoder;

/* Field names differ in length or in their first, middle or last letters: a hash of those
 * four, probed linearly, finds a field in one or two compares. */
static unsigned key_hash(const char *s, Py_ssize_t n) {
    if (n == 0) return 0;
    return ((unsigned)n * 131u + (unsigned char)s[0] * 31u + (unsigned char)s[n - 1] * 7u + (unsigned char)s[n / 2]) &
           (HASH_SLOTS - 1);
}

static int find_field(const Decoder *d, const char *s, Py_ssize_t n) {
    unsigned h = key_hash(s, n);
    for (int probe = 0; probe < HASH_SLOTS; probe++) {
        int f = d->slot_of[(h + probe) & (HASH_SLOTS - 1)];
        if (f < 0) return -1;
        if (d->fields[f].name_len == n && memcmp(d->fields[f].name, s, n) == 0) return f;
    }
    return -1;
}

/* Bytes a string may hold as they are: printable ASCII but the quote and the backslash. */
static unsigned char PLAIN[256];

static void init_plain(void) {
    for (int c = 0x20; c < 0x7f; c++) PLAIN[c] = c != '"' && c != '\\';
}

/* ---- the spec ------------------------------------------------------------------------ */

static int utf8_of(PyObject *o, const char **s, Py_ssize_t *n) {
    if (!PyUnicode_Check(o)) { PyErr_SetString(PyExc_TypeError, "expected str"); return -1; }
    *s = PyUnicode_AsUTF8AndSize(o, n);
    return *s == NULL ? -1 : 0;
}

/* fields: a sequence of tuples
 * (name, kind, nullable, default_kind, default, ctype, column, min_len, max_len, imin, imax, fmin, fmax, literals) */
static int Decoder_init(Decoder *self, PyObject *args, PyObject *kw) {
    PyObject *spec;
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTuple(args, "On", &spec, &max_bytes)) return -1;
    PyObject *seq = PySequence_Tuple(spec);
    if (seq == NULL) return -1;
    Py_XSETREF(self->keep, seq);
    self->max_record_bytes = max_bytes;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    if (n > MAX_FIELDS) { PyErr_SetString(PyExc_ValueError, "too many fields"); return -1; }
    self->n_fields = (int)n;
    self->n_columns = 0;
    self->required = 0;
    memset(self->slot_of, -1, sizeof self->slot_of);
    memset(self->next_after, -1, sizeof self->next_after);
    for (Py_ssize_t i = 0; i < n; i++) {
        Field *f = &self->fields[i];
        free_set(f->approved);
        memset(f, 0, sizeof *f);
        PyObject *name, *dflt, *literals;
        int patterned;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(seq, i), "UiiiOiinnLLddOii", &name, &f->kind, &f->nullable, &f->dflt,
                              &dflt, &f->ctype, &f->column, &f->min_len, &f->max_len, &f->imin, &f->imax, &f->fmin,
                              &f->fmax, &literals, &f->fold_case, &patterned))
            return -1;
        if (patterned) {
            f->approved = PyMem_Calloc(1, sizeof(ValueSet));
            if (f->approved == NULL) { PyErr_NoMemory(); return -1; }
        }
        if (utf8_of(name, &f->name, &f->name_len) < 0) return -1;
        for (Py_ssize_t k = 0; k < f->name_len; k++)
            if (!PLAIN[(unsigned char)f->name[k]]) {
                PyErr_SetString(PyExc_ValueError, "a field name outside plain text");
                return -1;
            }
        if (f->dflt == D_REQUIRED) self->required |= (uint64_t)1 << i;
        if (f->dflt == D_VALUE) {
            if (f->kind == K_STR || f->kind == K_SCHEMA) {
                if (utf8_of(dflt, &f->sdef, &f->sdef_len) < 0) return -1;
            } else if (f->kind == K_BOOL) {
                f->bdef = PyObject_IsTrue(dflt);
            } else if (f->kind == K_INT) {
                f->idef = PyLong_AsLongLong(dflt);
                if (PyErr_Occurred()) return -1;
            } else if (f->kind == K_FLOAT) {
                f->fdef = PyFloat_AsDouble(dflt);
                if (PyErr_Occurred()) return -1;
            } else {
                PyErr_SetString(PyExc_ValueError, "a default for this kind");
                return -1;
            }
        }
        if (literals != Py_None) {
            Py_ssize_t m = PyTuple_Size(literals);
            if (m < 0) return -1;
            if (m > MAX_ENUM) { PyErr_SetString(PyExc_ValueError, "too many literals"); return -1; }
            f->n_enum = (int)m;
            for (Py_ssize_t j = 0; j < m; j++) {
                if (utf8_of(PyTuple_GET_ITEM(literals, j), &f->enum_val[j], &f->enum_len[j]) < 0) return -1;
                for (Py_ssize_t k = 0; k < f->enum_len[j]; k++)
                    if (!PLAIN[(unsigned char)f->enum_val[j][k]]) {
                        PyErr_SetString(PyExc_ValueError, "a literal outside plain text");
                        return -1;
                    }
            }
        }
        if (f->column >= 0) {
            if (f->column >= MAX_FIELDS || f->column != self->n_columns) {
                PyErr_SetString(PyExc_ValueError, "columns are numbered in field order");
                return -1;
            }
            self->column_field[self->n_columns++] = (int)i;
        }
        unsigned h = key_hash(f->name, f->name_len);
        while (self->slot_of[h] >= 0) h = (h + 1) & (HASH_SLOTS - 1);
        self->slot_of[h] = (signed char)i;
    }
    return 0;
}

static void Decoder_dealloc(Decoder *self) {
    for (int i = 0; i < self->n_fields; i++) free_set(self->fields[i].approved);
    Py_XDECREF(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- one record ---------------------------------------------------------------------- */

#define WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n' || (c) == '\r')

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A string's bytes between its quotes: printable ASCII, no escape (else declined). */
static const char *scan_string(const char *p, const char *end, const char **s, Py_ssize_t *n) {
    /* No bounds test in the loop: a bytes object ends in a NUL (past its size), which is not plain. */
    const unsigned char *q = (const unsigned char *)p + 1, *e = (const unsigned char *)end;
    while (PLAIN[*q]) q++;
    if (q >= e || *q != '"') return NULL;
    *s = p + 1;
    *n = (const char *)q - (p + 1);
    return (const char *)q + 1;
}

/* A JSON number, as an integer where it has no fraction or exponent (is_int), else as the
 * nearest double: exactly as a correctly rounding parser gives it (one IEEE operation on
 * exact operands where that suffices, Python's own dtoa otherwise). */
static const char *scan_number(const char *p, const char *end, int *is_int, long long *iv, double *dv) {
    const char *start = p;
    int neg = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    if (p >= end || *p < '0' || *p > '9') return NULL;
    unsigned long long mant = 0;
    int digits = 0, frac_digits = 0;
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9') return NULL; /* leading zero */
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            if (++digits > 18) return NULL;
            mant = mant * 10 + (unsigned)(*p - '0');
            p++;
        }
    }
    int has_frac = 0, has_exp = 0;
    long exp10 = 0;
    if (p < end && *p == '.') {
        has_frac = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9') return NULL;
        while (p < end && *p >= '0' && *p <= '9') {
            if (mant == 0 && *p == '0') { frac_digits++; p++; continue; } /* leading zeros of a fraction */
            if (++digits > 18) return NULL;
            mant = mant * 10 + (unsigned)(*p - '0');
            frac_digits++;
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        has_exp = 1;
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        if (p >= end || *p < '0' || *p > '9') return NULL;
        int edigits = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (++edigits > 4) return NULL;
            exp10 = exp10 * 10 + (*p - '0');
            p++;
        }
        if (eneg) exp10 = -exp10;
    }
    if (!has_frac && !has_exp) {
        *is_int = 1;
        *iv = neg ? -(long long)mant : (long long)mant;
        *dv = (double)*iv; /* exact: at most 18 digits but used only below 2^53 (checked by caller) */
        return p;
    }
    *is_int = 0;
    long e = exp10 - frac_digits;
    if (mant == 0) {
        *dv = neg ? -0.0 : 0.0;
        return p;
    }
    if (mant < (1ULL << 53) && e >= -22 && e <= 22) {
        double m = (double)mant;
        double v = e < 0 ? m / POW10[-e] : m * POW10[e];
        *dv = neg ? -v : v;
        return p;
    }
    Py_ssize_t len = p - start;
    if (len >= MAX_NUMBER_CHARS) return NULL;
    char buf[MAX_NUMBER_CHARS];
    memcpy(buf, start, len);
    buf[len] = '\0';
    char *stop = NULL;
    double v = PyOS_string_to_double(buf, &stop, NULL);
    if (v == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return NULL; }
    if (stop != buf + len) return NULL;
    if (v == 0.0 || fabs(v) < 2.2250738585072014e-308) return NULL; /* underflow: left to the reference */
    *dv = v;
    return p;
}

static int is_leap(long y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

static long days_from_civil(long y, long m, long d) { /* days since 1970-01-01 (Howard Hinnant's) */
    y -= m <= 2;
    long era = (y >= 0 ? y : y - 399) / 400;
    long yoe = y - era * 400;
    long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int digits_at(const char *s, int n, long *out) {
    long v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

/* `YYYY-MM-DDTHH:MM:SS[.fff|.ffffff](Z|z|+00:00)` → epoch ms as the reference computes it
 * (int(datetime.timestamp() * 1000): microseconds over 10^6 in a double, times 1000,
 * truncated). Any other spelling is declined (-1). */
static int parse_rfc3339_ms(const char *s, Py_ssize_t n, long long *ms) {
    if (n < 20) return -1;
    long y, mo, d, h, mi, se, us = 0;
    if (digits_at(s, 4, &y) || s[4] != '-' || digits_at(s + 5, 2, &mo) || s[7] != '-' || digits_at(s + 8, 2, &d) ||
        s[10] != 'T' || digits_at(s + 11, 2, &h) || s[13] != ':' || digits_at(s + 14, 2, &mi) || s[16] != ':' ||
        digits_at(s + 17, 2, &se))
        return -1;
    Py_ssize_t i = 19;
    if (s[i] == '.') {
        Py_ssize_t j = i + 1;
        while (j < n && s[j] >= '0' && s[j] <= '9') j++;
        Py_ssize_t nd = j - i - 1;
        if (nd == 3) { if (digits_at(s + i + 1, 3, &us)) return -1; us *= 1000; }
        else if (nd == 6) { if (digits_at(s + i + 1, 6, &us)) return -1; }
        else return -1;
        i = j;
    }
    if (n - i == 1 && (s[i] == 'Z' || s[i] == 'z')) {
    } else if (n - i == 6 && memcmp(s + i, "+00:00", 6) == 0) {
    } else {
        return -1;
    }
    static const int mdays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || se > 59) return -1;
    if (d > mdays[mo - 1] + (mo == 2 && is_leap(y))) return -1;
    long long secs = (long long)days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se;
    long long total_us = secs * 1000000 + us;
    if (total_us <= 0 || total_us >= (1LL << 53)) return -1;
    double t = (double)total_us / 1e6;
    *ms = (long long)(t * 1000.0);
    return 0;
}

/* Parses one record into `slots`; 0 if accepted, -1 if declined. */
/* Whether the JSON string at p (its opening quote) is exactly the plain text s[0:n]. */
static inline int string_is(const char *p, const char *end, const char *s, Py_ssize_t n) {
    return end - p > n + 1 && memcmp(p + 1, s, n) == 0 && p[n + 1] == '"';
}

static int parse_record(Decoder *d, const char *p, const char *end, Slot *slots) {
    int prev = MAX_FIELDS;
    uint64_t seen = 0;
    while (p < end && WS(*p)) p++;
    if (p >= end || *p != '{') return -1;
    p++;
    while (p < end && WS(*p)) p++;
    if (p < end && *p == '}') return -1;
    for (;;) {
        if (p >= end || *p != '"') return -1;
        int fi = d->next_after[prev];
        if (fi >= 0 && string_is(p, end, d->fields[fi].name, d->fields[fi].name_len)) {
            p += d->fields[fi].name_len + 2;
        } else {
            const char *key;
            Py_ssize_t klen;
            if ((p = scan_string(p, end, &key, &klen)) == NULL) return -1;
            if ((fi = find_field(d, key, klen)) < 0) return -1;
            d->next_after[prev] = (signed char)fi;
        }
        prev = fi;
        uint64_t bit = (uint64_t)1 << fi;
        if (seen & bit) return -1;
        seen |= bit;
        const Field *f = &d->fields[fi];
        Slot *s = &slots[fi];
        while (p < end && WS(*p)) p++;
        if (p >= end || *p != ':') return -1;
        p++;
        while (p < end && WS(*p)) p++;
        if (p >= end) return -1;
        char c = *p;
        if (c == 'n') {
            if (!f->nullable || end - p < 4 || memcmp(p, "null", 4) != 0) return -1;
            s->state = S_NULL;
            p += 4;
        } else {
            s->state = S_VALUE;
            switch (f->kind) {
            case K_SCHEMA:
            case K_STR:
                if (c != '"') return -1;
                if (f->n_enum) { /* one of the literals, compared in place (they are plain text) */
                    int j = 0;
                    while (j < f->n_enum && !string_is(p, end, f->enum_val[j], f->enum_len[j])) j++;
                    if (j == f->n_enum) return -1;
                    s->s = p + 1;
                    s->slen = f->enum_len[j];
                    p += s->slen + 2;
                    break;
                }
                if ((p = scan_string(p, end, &s->s, &s->slen)) == NULL) return -1;
                if (s->slen < f->min_len || s->slen > f->max_len) {
                    return -1; /* ASCII: the length in bytes is the length in characters */
                } else if (f->approved != NULL && !approved(f->approved, s->s, s->slen)) {
                    return -1;
                }
                break;
            case K_INT: {
                int is_int;
                double dv;
                if ((p = scan_number(p, end, &is_int, &s->i, &dv)) == NULL || !is_int) return -1;
                if (s->i < f->imin || s->i > f->imax) return -1;
                break;
            }
            case K_FLOAT: {
                int is_int;
                long long iv;
                if ((p = scan_number(p, end, &is_int, &iv, &s->f)) == NULL) return -1;
                if (is_int && (iv > (1LL << 53) || iv < -(1LL << 53))) return -1;
                if (!(s->f >= f->fmin && s->f <= f->fmax)) return -1; /* NaN and infinities fail here */
                break;
            }
            case K_BOOL:
                if (end - p >= 4 && memcmp(p, "true", 4) == 0) { s->i = 1; p += 4; }
                else if (end - p >= 5 && memcmp(p, "false", 5) == 0) { s->i = 0; p += 5; }
                else return -1;
                break;
            case K_TS:
                if (c == '"') {
                    const char *ts;
                    Py_ssize_t tlen;
                    if ((p = scan_string(p, end, &ts, &tlen)) == NULL || tlen > f->max_len) return -1;
                    if (parse_rfc3339_ms(ts, tlen, &s->i) < 0) return -1;
                } else {
                    int is_int;
                    double dv;
                    if ((p = scan_number(p, end, &is_int, &s->i, &dv)) == NULL || !is_int) return -1;
                }
                if (s->i < f->imin || s->i > f->imax) return -1;
                break;
            default:
                return -1;
            }
        }
        while (p < end && WS(*p)) p++;
        if (p >= end) return -1;
        if (*p == ',') {
            p++;
            while (p < end && WS(*p)) p++;
            continue;
        }
        if (*p != '}') return -1;
        p++;
        break;
    }
    while (p < end && WS(*p)) p++;
    if (p != end) return -1;
    if ((seen & d->required) != d->required) return -1;
    for (int i = 0; i < d->n_fields; i++)
        if (!(seen & ((uint64_t)1 << i))) slots[i].state = S_ABSENT;
    return 0;
}

/* ---- the columns --------------------------------------------------------------------- */

typedef struct {
    PyObject *values;   /* bytes: fixed-width values, packed booleans, or string offsets (int64) */
    PyObject *validity; /* bytes: bitmap */
    PyObject *data;     /* bytes: string bytes */
    char *v, *bits;
    Py_ssize_t data_len, data_cap, nulls;
} Column;

static int column_alloc(Column *c, int ctype, Py_ssize_t n) {
    Py_ssize_t width = ctype == C_I32 ? 4 : 8, size;
    if (ctype == C_BOOL) size = n / 8 + 1;
    else if (ctype == C_STR) size = (n + 1) * 8;
    else size = n * width;
    c->values = PyBytes_FromStringAndSize(NULL, size ? size : 1);
    c->validity = PyBytes_FromStringAndSize(NULL, n / 8 + 1);
    if (c->values == NULL || c->validity == NULL) return -1;
    c->v = PyBytes_AS_STRING(c->values);
    c->bits = PyBytes_AS_STRING(c->validity);
    memset(c->bits, 0, n / 8 + 1);
    if (ctype == C_BOOL) memset(c->v, 0, n / 8 + 1);
    if (ctype == C_STR) {
        c->data_cap = 16 * n + 64;
        c->data = PyBytes_FromStringAndSize(NULL, c->data_cap);
        if (c->data == NULL) return -1;
        ((int64_t *)c->v)[0] = 0;
    }
    return 0;
}

static int column_put(Column *c, int ctype, Py_ssize_t row, const Field *f, const Slot *s) {
    int state = s->state;
    long long i = s->i;
    double x = s->f;
    const char *str = s->s;
    Py_ssize_t slen = s->slen;
    if (state == S_ABSENT) {
        if (f->dflt != D_VALUE) state = S_NULL;
        else {
            state = S_VALUE;
            i = f->kind == K_BOOL ? f->bdef : f->idef;
            x = f->fdef;
            str = f->sdef;
            slen = f->sdef_len;
        }
    }
    if (state == S_NULL) {
        c->nulls++;
        switch (ctype) {
        case C_I32: ((int32_t *)c->v)[row] = 0; break;
        case C_I64: ((int64_t *)c->v)[row] = 0; break;
        case C_F64: ((double *)c->v)[row] = 0.0; break;
        case C_STR: ((int64_t *)c->v)[row + 1] = c->data_len; break;
        default: break;
        }
        return 0;
    }
    c->bits[row >> 3] |= (char)(1 << (row & 7));
    switch (ctype) {
    case C_I32: ((int32_t *)c->v)[row] = (int32_t)i; break;
    case C_I64: ((int64_t *)c->v)[row] = i; break;
    case C_F64: ((double *)c->v)[row] = x; break;
    case C_BOOL: if (i) c->v[row >> 3] |= (char)(1 << (row & 7)); break;
    case C_STR:
        if (c->data_len + slen > c->data_cap) {
            Py_ssize_t cap = (c->data_cap + slen) * 2;
            if (_PyBytes_Resize(&c->data, cap) < 0) return -1;
            c->data_cap = cap;
        }
        if (f->fold_case) {
            char *to = PyBytes_AS_STRING(c->data) + c->data_len;
            for (Py_ssize_t j = 0; j < slen; j++) to[j] = (str[j] >= 'A' && str[j] <= 'Z') ? str[j] + 32 : str[j];
        } else {
            memcpy(PyBytes_AS_STRING(c->data) + c->data_len, str, slen);
        }
        c->data_len += slen;
        ((int64_t *)c->v)[row + 1] = c->data_len;
        break;
    default: break;
    }
    return 0;
}

/* decode(values) → (accepted positions as int64 bytes, declined positions: list[int],
 * columns: list of (values, validity or None, null count, data or None)) */
static PyObject *Decoder_decode(Decoder *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "values must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Column cols[MAX_FIELDS];
    memset(cols, 0, sizeof cols);
    PyObject *declined = PyList_New(0), *accepted = PyBytes_FromStringAndSize(NULL, n * 8 + 8), *out = NULL;
    Slot slots[MAX_FIELDS];
    Py_ssize_t rows = 0;
    if (declined == NULL || accepted == NULL) goto done;
    for (int c = 0; c < self->n_columns; c++)
        if (column_alloc(&cols[c], self->fields[self->column_field[c]].ctype, n) < 0) goto done;
    int64_t *acc = (int64_t *)PyBytes_AS_STRING(accepted);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *v = items[k];
        int ok = -1;
        if (PyBytes_Check(v) && PyBytes_GET_SIZE(v) <= self->max_record_bytes) {
            const char *p = PyBytes_AS_STRING(v);
            ok = parse_record(self, p, p + PyBytes_GET_SIZE(v), slots);
        }
        if (ok < 0) {
            PyObject *pos = PyLong_FromSsize_t(k);
            if (pos == NULL || PyList_Append(declined, pos) < 0) { Py_XDECREF(pos); goto done; }
            Py_DECREF(pos);
            continue;
        }
        for (int c = 0; c < self->n_columns; c++) {
            int fi = self->column_field[c];
            if (column_put(&cols[c], self->fields[fi].ctype, rows, &self->fields[fi], &slots[fi]) < 0) goto done;
        }
        acc[rows++] = k;
    }
    if (_PyBytes_Resize(&accepted, rows * 8) < 0) goto done;
    PyObject *columns = PyList_New(self->n_columns);
    if (columns == NULL) goto done;
    for (int c = 0; c < self->n_columns; c++) {
        Column *col = &cols[c];
        if (col->data != NULL && _PyBytes_Resize(&col->data, col->data_len) < 0) { Py_DECREF(columns); goto done; }
        PyObject *t = Py_BuildValue("(OOnO)", col->values, col->nulls ? col->validity : Py_None, col->nulls,
                                    col->data != NULL ? col->data : Py_None);
        if (t == NULL) { Py_DECREF(columns); goto done; }
        PyList_SET_ITEM(columns, c, t);
    }
    out = Py_BuildValue("(nOON)", rows, accepted, declined, columns);
done:
    for (int c = 0; c < self->n_columns; c++) {
        Py_XDECREF(cols[c].values);
        Py_XDECREF(cols[c].validity);
        Py_XDECREF(cols[c].data);
    }
    Py_XDECREF(accepted);
    Py_XDECREF(declined);
    Py_DECREF(seq);
    return out;
}

/* approve(field, value): the reference accepted `value` in the patterned field `field`. */
static PyObject *Decoder_approve(Decoder *self, PyObject *args) {
    int fi;
    PyObject *value;
    if (!PyArg_ParseTuple(args, "iU", &fi, &value)) return NULL;
    if (fi < 0 || fi >= self->n_fields || self->fields[fi].approved == NULL) {
        PyErr_SetString(PyExc_ValueError, "not a patterned field");
        return NULL;
    }
    const char *s;
    Py_ssize_t n;
    if (utf8_of(value, &s, &n) < 0 || approve(self->fields[fi].approved, s, n) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Decoder_methods[] = {
    {"approve", (PyCFunction)Decoder_approve, METH_VARARGS, "approve(field, value): a value the reference accepted"},
    {"decode", (PyCFunction)Decoder_decode, METH_O,
     "decode(values) -> (rows, accepted int64 positions, declined positions, columns)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tailwatch.ingest._columnar.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Decoder_init,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_methods = Decoder_methods,
    .tp_doc = "Decoder(fields, max_record_bytes): JSON records of one schema into Arrow column buffers",
};

static PyObject *py_rfc3339_ms(PyObject *mod, PyObject *arg) {
    const char *s;
    Py_ssize_t n;
    if (utf8_of(arg, &s, &n) < 0) return NULL;
    long long ms;
    if (parse_rfc3339_ms(s, n, &ms) < 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(ms);
}

/* read_messages(messages) → (values, partitions as int32 bytes, offsets and record timestamps
 * as int64 bytes): what the worker reads of each consumed record, in one pass without a
 * Python frame per record (a record without a timestamp: -1). */
static PyObject *py_read_messages(PyObject *mod, PyObject *arg) {
    static PyObject *s_value, *s_partition, *s_offset, *s_timestamp;
    if (s_value == NULL && ((s_value = PyUnicode_InternFromString("value")) == NULL ||
                            (s_partition = PyUnicode_InternFromString("partition")) == NULL ||
                            (s_offset = PyUnicode_InternFromString("offset")) == NULL ||
                            (s_timestamp = PyUnicode_InternFromString("timestamp")) == NULL))
        return NULL;
    PyObject *seq = PySequence_Fast(arg, "messages must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *values = PyList_New(n), *parts = PyBytes_FromStringAndSize(NULL, n * 4),
             *offsets = PyBytes_FromStringAndSize(NULL, n * 8), *stamps = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *out = NULL;
    if (values == NULL || parts == NULL || offsets == NULL || stamps == NULL) goto done;
    int32_t *pp = (int32_t *)PyBytes_AS_STRING(parts);
    int64_t *po = (int64_t *)PyBytes_AS_STRING(offsets), *pt = (int64_t *)PyBytes_AS_STRING(stamps);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *v = PyObject_CallMethodNoArgs(m, s_value);
        if (v == NULL) goto done;
        PyList_SET_ITEM(values, i, v);
        PyObject *x = PyObject_CallMethodNoArgs(m, s_partition);
        if (x == NULL) goto done;
        long long part = PyLong_AsLongLong(x);
        Py_DECREF(x);
        if (part == -1 && PyErr_Occurred()) goto done;
        pp[i] = (int32_t)part;
        if ((x = PyObject_CallMethodNoArgs(m, s_offset)) == NULL) goto done;
        po[i] = PyLong_AsLongLong(x);
        Py_DECREF(x);
        if (po[i] == -1 && PyErr_Occurred()) goto done;
        if ((x = PyObject_CallMethodNoArgs(m, s_timestamp)) == NULL) goto done;
        if (!PyTuple_Check(x) || PyTuple_GET_SIZE(x) != 2) {
            Py_DECREF(x);
            PyErr_SetString(PyExc_TypeError, "timestamp() must return (type, ms)");
            goto done;
        }
        pt[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(x, 1));
        Py_DECREF(x);
        if (pt[i] == -1 && PyErr_Occurred()) goto done;
    }
    out = Py_BuildValue("(OOOO)", values, parts, offsets, stamps);
done:
    Py_XDECREF(values);
    Py_XDECREF(parts);
    Py_XDECREF(offsets);
    Py_XDECREF(stamps);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef module_methods[] = {
    {"read_messages", py_read_messages, METH_O, "read_messages(messages) -> (values, partitions, offsets, timestamps)"},
    {"rfc3339_ms", py_rfc3339_ms, METH_O, "epoch ms of a timestamp in the canonical spelling, else None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_columnar", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__columnar(void) {
    init_plain();
    if (PyType_Ready(&DecoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
        Py_DECREF(&DecoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
