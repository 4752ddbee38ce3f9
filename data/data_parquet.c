/*
 * data/data_parquet.c - Kiln's own Parquet reader (Debian ships no Arrow).
 *
 * A Parquet file is "PAR1", column chunks grouped in row groups, a footer
 * (FileMetaData in Thrift's compact protocol), the footer's length (4 bytes
 * LE) and "PAR1". This file reads, in order: the footer (thrift_* below: a
 * cursor over compact-protocol bytes and one parser per struct, skipping the
 * fields Kiln does not use), the schema (flattened to its leaf columns with
 * their definition and repetition levels), and then, one row group at a
 * time, the column chunks of the mapped columns only: pages (v1 and v2, and
 * the dictionary page), decompressed (SNAPPY with libsnappy, GZIP with zlib,
 * ZSTD with libzstd), their levels (RLE/bit-packed hybrid) and their values
 * (PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY, RLE booleans,
 * DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY,
 * BYTE_STREAM_SPLIT). The encodings follow apache/parquet-format's
 * Encodings.md; the structs its parquet.thrift.
 *
 * Values are turned into what a batch holds as they are decoded, once per
 * dictionary entry when there is a dictionary: a categorical column's
 * values become keys (integers as they are, masked to 63 bits; strings
 * hashed exactly as a TSV field is, data_key_hash), a dense column's become
 * floats (log1p of integers as TSV does; floats as they are unless the
 * mapping says log1p), a label's become 0 / 1 or NaN when it is neither. A
 * row is a run of level entries starting at repetition level 0; a value is
 * an entry at the column's maximum definition level, so a LIST<INT64>
 * (optional group (LIST) { repeated group list { optional element } })
 * gives a bag of the row's non-null elements, and a null or empty list an
 * empty bag, as an empty TSV field does.
 *
 * Every length read from the file is checked against what holds it before
 * it is used; a page or footer that does not decode is KILN_ECORRUPT naming
 * the file, the row group, the column and the byte where its page starts.
 */
#include "data_parquet_int.h"

#include <errno.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PQ_EXPAND_AVX512 1
#endif
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "Parquet's PLAIN values are read with memcpy, which assumes a little-endian host"
#endif

/* Thrift nesting deeper than this is refused (a real footer nests 5 deep). */
#define THRIFT_MAX_DEPTH 32
/* A page larger than this (compressed or not) is refused as corrupt: Parquet
 * writers keep pages near 1 MiB; a length past this is a damaged header. */
#define PQ_MAX_PAGE ((int64_t)1 << 30)
/* Footers longer than this are refused (a Criteo footer is a few KiB). */
#define PQ_MAX_FOOTER ((int64_t)64 << 20)
/* Schema columns past this are refused. */
#define PQ_MAX_LEAVES 100000
/* A row group of more rows, or a page of more level entries, is refused:
 * the reader holds a row group's mapped columns decoded (4 to 8 bytes per
 * value), and writers cut row groups near 1M rows (Arrow, NVTabular) and
 * pages near 20k values; a count past these is a damaged header, which must
 * not make the reader allocate gigabytes. */
#define PQ_MAX_RG_ROWS ((int64_t)1 << 24)
#define PQ_MAX_PAGE_VALUES ((int64_t)1 << 24)
/* The level entries of one column chunk (a list column's can outnumber its
 * rows): past this the chunk is refused, for the same reason. */
#define PQ_MAX_CHUNK_VALUES ((int64_t)1 << 26)

/* parquet.thrift's enums, as far as Kiln reads them. */
enum { PT_BOOLEAN, PT_INT32, PT_INT64, PT_INT96, PT_FLOAT, PT_DOUBLE, PT_BYTE_ARRAY, PT_FLBA };
enum { REP_REQUIRED, REP_OPTIONAL, REP_REPEATED };
enum { PAGE_DATA = 0, PAGE_INDEX = 1, PAGE_DICT = 2, PAGE_DATA_V2 = 3 };
enum {
    ENC_PLAIN = 0,
    ENC_PLAIN_DICT = 2,
    ENC_RLE = 3,
    ENC_BIT_PACKED = 4,
    ENC_DELTA_BP = 5,
    ENC_DELTA_LBA = 6,
    ENC_DELTA_BA = 7,
    ENC_RLE_DICT = 8,
    ENC_BSS = 9
};
enum { CODEC_NONE = 0, CODEC_SNAPPY = 1, CODEC_GZIP = 2, CODEC_ZSTD = 6 };

static const char *const type_names[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                         "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
static const char *const codec_names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP",   "LZO",
                                          "BROTLI",       "LZ4",    "ZSTD",   "LZ4_RAW"};
static const char *const encoding_names[] = {
    "PLAIN",      "GROUP_VAR_INT",          "PLAIN_DICTIONARY", "RLE",
    "BIT_PACKED", "DELTA_BINARY_PACKED",    "DELTA_LENGTH_BYTE_ARRAY",
    "DELTA_BYTE_ARRAY", "RLE_DICTIONARY",   "BYTE_STREAM_SPLIT"};

#define NAME_OF(names, v)                                                                          \
    ((v) >= 0 && (size_t)(v) < sizeof names / sizeof names[0] ? names[v] : "unknown")

/* ---- Thrift compact protocol ---------------------------------------------------------
 * A cursor over [p, end). Every reader returns false (and sets bad) when the
 * bytes run out or make no sense; a struct parser stops at the first. */
typedef struct {
    const unsigned char *p, *end;
    bool bad;
    int depth;
} tc_t;

enum {
    TT_STOP = 0,
    TT_TRUE = 1,
    TT_FALSE = 2,
    TT_BYTE = 3,
    TT_I16 = 4,
    TT_I32 = 5,
    TT_I64 = 6,
    TT_DOUBLE = 7,
    TT_BINARY = 8,
    TT_LIST = 9,
    TT_SET = 10,
    TT_MAP = 11,
    TT_STRUCT = 12
};

static bool tc_fail(tc_t *t)
{
    t->bad = true;
    t->p = t->end;
    return false;
}

static bool tc_varint(tc_t *t, uint64_t *v)
{
    uint64_t x = 0;
    for (int sh = 0; sh < 64; sh += 7) {
        if (t->p >= t->end)
            return tc_fail(t);
        unsigned char b = *t->p++;
        x |= (uint64_t)(b & 0x7f) << sh;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return tc_fail(t);
}

static bool tc_zigzag(tc_t *t, int64_t *v)
{
    uint64_t u;
    if (!tc_varint(t, &u))
        return false;
    *v = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
    return true;
}

static bool tc_binary(tc_t *t, const unsigned char **s, size_t *len)
{
    uint64_t n;
    if (!tc_varint(t, &n))
        return false;
    if (n > (uint64_t)(t->end - t->p))
        return tc_fail(t);
    *s = t->p;
    *len = (size_t)n;
    t->p += n;
    return true;
}

/* A list header: element type and count. */
static bool tc_list(tc_t *t, int *etype, int64_t *n)
{
    if (t->p >= t->end)
        return tc_fail(t);
    unsigned char h = *t->p++;
    uint64_t cnt = h >> 4;
    *etype = h & 0x0f;
    if (cnt == 15 && !tc_varint(t, &cnt))
        return false;
    /* Every element takes at least one byte (bools in lists too). */
    if (cnt > (uint64_t)(t->end - t->p))
        return tc_fail(t);
    *n = (int64_t)cnt;
    return true;
}

/* A field header: its id (from the last id and the delta) and type; type
 * TT_STOP ends the struct. */
static bool tc_field(tc_t *t, int16_t *last, int *type, int16_t *id)
{
    if (t->p >= t->end)
        return tc_fail(t);
    unsigned char h = *t->p++;
    *type = h & 0x0f;
    if (*type == TT_STOP)
        return true;
    if (h >> 4) {
        *id = (int16_t)(*last + (h >> 4));
    } else {
        int64_t x;
        if (!tc_zigzag(t, &x) || x < INT16_MIN || x > INT16_MAX)
            return tc_fail(t);
        *id = (int16_t)x;
    }
    *last = *id;
    return true;
}

typedef bool (*tc_field_fn)(tc_t *t, int16_t id, int type, void *arg);
static bool tc_struct(tc_t *t, tc_field_fn fn, void *arg);
static bool tc_skip(tc_t *t, int type);

static bool skip_field(tc_t *t, int16_t id, int type, void *arg)
{
    return tc_skip(t, type);
}

/* Skips one value of type (bools in a field header carry their value). */
static bool tc_skip(tc_t *t, int type)
{
    uint64_t u;
    const unsigned char *s;
    size_t len;
    switch (type) {
    case TT_TRUE:
    case TT_FALSE:
        return true;
    case TT_BYTE:
        if (t->p >= t->end)
            return tc_fail(t);
        t->p++;
        return true;
    case TT_I16:
    case TT_I32:
    case TT_I64:
        return tc_varint(t, &u);
    case TT_DOUBLE:
        if (t->end - t->p < 8)
            return tc_fail(t);
        t->p += 8;
        return true;
    case TT_BINARY:
        return tc_binary(t, &s, &len);
    case TT_LIST:
    case TT_SET: {
        int et;
        int64_t n;
        if (!tc_list(t, &et, &n))
            return false;
        if (++t->depth > THRIFT_MAX_DEPTH)
            return tc_fail(t);
        for (int64_t i = 0; i < n; i++)
            if (!tc_skip(t, et == TT_TRUE || et == TT_FALSE ? TT_BYTE : et))
                return false;
        t->depth--;
        return true;
    }
    case TT_MAP: {
        uint64_t n;
        if (!tc_varint(t, &n))
            return false;
        if (n == 0)
            return true;
        if (t->p >= t->end || n > (uint64_t)(t->end - t->p))
            return tc_fail(t);
        unsigned char kv = *t->p++;
        int kt = kv >> 4, vt = kv & 0x0f;
        if (++t->depth > THRIFT_MAX_DEPTH)
            return tc_fail(t);
        for (uint64_t i = 0; i < n; i++) {
            if (!tc_skip(t, kt == TT_TRUE || kt == TT_FALSE ? TT_BYTE : kt) ||
                !tc_skip(t, vt == TT_TRUE || vt == TT_FALSE ? TT_BYTE : vt))
                return false;
        }
        t->depth--;
        return true;
    }
    case TT_STRUCT:
        return tc_struct(t, skip_field, NULL);
    default:
        return tc_fail(t);
    }
}

/* Reads an integer field of whichever integer type the writer used. */
static bool tc_int_field(tc_t *t, int type, int64_t *v)
{
    if (type != TT_I16 && type != TT_I32 && type != TT_I64 && type != TT_BYTE)
        return tc_fail(t);
    if (type == TT_BYTE) {
        if (t->p >= t->end)
            return tc_fail(t);
        *v = (int8_t)*t->p++;
        return true;
    }
    return tc_zigzag(t, v);
}

/* Walks a struct: calls fn for each field (fn skips what it does not read). */
static bool tc_struct(tc_t *t, tc_field_fn fn, void *arg)
{
    int16_t last = 0, id = 0;
    int type;
    if (++t->depth > THRIFT_MAX_DEPTH)
        return tc_fail(t);
    for (;;) {
        if (!tc_field(t, &last, &type, &id))
            return false;
        if (type == TT_STOP)
            break;
        if (!fn(t, id, type, arg))
            return tc_fail(t);
    }
    t->depth--;
    return !t->bad;
}

/* ---- the footer's structs --------------------------------------------------------- */
/* parquet.thrift's ConvertedType values Kiln reads (writers set them beside
 * the newer logicalType for readers like this one). */
enum { CT_DECIMAL = 5, CT_UINT_8 = 11, CT_UINT_64 = 14 };

typedef struct {
    int type;      /* PT_*, -1 for a group */
    int rep;       /* REP_* */
    int nchildren; /* 0 for a leaf */
    int converted; /* ConvertedType, -1 when none */
    int scale;     /* DECIMAL's */
    char name[128];
} schema_el_t;

static bool read_int(tc_t *t, int type, int64_t lo, int64_t hi, int64_t *v)
{
    return tc_int_field(t, type, v) && *v >= lo && *v <= hi;
}

/* read_int into an int. */
static bool read_int32(tc_t *t, int type, int64_t lo, int64_t hi, int *out)
{
    int64_t v;
    if (!read_int(t, type, lo, hi, &v))
        return false;
    *out = (int)v;
    return true;
}

static bool schema_field(tc_t *t, int16_t id, int type, void *arg)
{
    schema_el_t *e = arg;
    const unsigned char *s;
    size_t len;
    switch (id) {
    case 1:
        return read_int32(t, type, PT_BOOLEAN, PT_FLBA, &e->type);
    case 3:
        return read_int32(t, type, REP_REQUIRED, REP_REPEATED, &e->rep);
    case 4:
        if (type != TT_BINARY || !tc_binary(t, &s, &len))
            return false;
        len = len < sizeof e->name - 1 ? len : sizeof e->name - 1;
        memcpy(e->name, s, len);
        e->name[len] = '\0';
        return true;
    case 5:
        return read_int32(t, type, 0, PQ_MAX_LEAVES, &e->nchildren);
    case 6:
        return read_int32(t, type, 0, 1000, &e->converted);
    case 7:
        return read_int32(t, type, 0, 100, &e->scale);
    default:
        return tc_skip(t, type);
    }
}

/* One leaf column of the schema: the top-level field it belongs to, its
 * type, and its maximum levels. */
typedef struct {
    char top[128];
    int type;
    int converted, scale; /* the schema element's */
    int max_def, max_rep;
} leaf_t;

/* One mapped column of one row group: where its chunk lies and how. */
typedef struct {
    int64_t start, size; /* bytes of the chunk in the file */
    int64_t num_values;  /* level entries (rows for a flat column) */
    int codec;
    int type;
} chunk_t;

typedef struct {
    int64_t data_off, dict_off, size, num_values;
    int codec, type;
    bool has_dict;
} colmeta_t;

static bool colmeta_field(tc_t *t, int16_t id, int type, void *arg)
{
    colmeta_t *m = arg;
    switch (id) {
    case 1:
        return read_int32(t, type, PT_BOOLEAN, PT_FLBA, &m->type);
    case 4:
        return read_int32(t, type, 0, INT32_MAX, &m->codec);
    case 5:
        return read_int(t, type, 0, INT64_MAX, &m->num_values);
    case 7:
        return read_int(t, type, 0, INT64_MAX, &m->size);
    case 9:
        return read_int(t, type, 0, INT64_MAX, &m->data_off);
    case 11:
        m->has_dict = true;
        return read_int(t, type, 0, INT64_MAX, &m->dict_off);
    default:
        return tc_skip(t, type);
    }
}

typedef struct {
    colmeta_t meta;
    bool has_meta;
    bool external; /* file_path set: the chunk lives in another file */
} colchunk_t;

static bool colchunk_field(tc_t *t, int16_t id, int type, void *arg)
{
    colchunk_t *c = arg;
    if (id == 1 && type == TT_BINARY) {
        const unsigned char *s;
        size_t len;
        if (!tc_binary(t, &s, &len))
            return false;
        c->external = len > 0;
        return true;
    }
    if (id == 3 && type == TT_STRUCT) {
        c->has_meta = true;
        return tc_struct(t, colmeta_field, &c->meta);
    }
    return tc_skip(t, type);
}


/* ---- the file --------------------------------------------------------------------- */

/* What a mapped column feeds. */
typedef enum { ROLE_LABEL, ROLE_DENSE, ROLE_CAT } role_t;

/* A mapped column: what it is in the file and what it becomes. */
typedef struct {
    const char *name; /* borrowed from the file's names[] */
    role_t role;
    int index; /* dense feature or slot */
    int leaf;  /* schema leaf (column chunk index in a row group) */
    int type, max_def, max_rep;
    bool log1p;      /* dense: log(1 + max(x, 0)) */
    bool is_unsigned; /* UINT_8..UINT_64: INT32 zero-extends, INT64 reads as uint64 */
    double decimal;  /* DECIMAL: 10^-scale, the unscaled integer's weight; 0 otherwise */
} col_t;

/* A mapped column's values in the decoded row group. */
typedef struct {
    float *f;      /* [rows] label / dense: the value (label: NaN when not 0 / 1 / null) */
    uint32_t *cnt; /* [rows + 1] categorical: row r's key count; its keys follow row r-1's */
    /* categorical: the keys, nkeys of them, as keys or (by_id) as indices
     * into dict_k, gathered when the rows go into a batch: a dictionary
     * column's keys are then written once, not in the column and again in
     * the batch */
    int64_t *keys; /* [kcap] */
    uint32_t *ids; /* [icap] */
    int64_t nkeys, kcap, icap;
    bool by_id;
    int64_t rows; /* rows filled so far */
    /* categorical: where append_rows stopped, rows before at_row holding
     * at_key keys, so that the next run's first key is found without a
     * table of offsets */
    int64_t at_row, at_key;
    /* the dictionary, converted */
    float *dict_f;
    int64_t *dict_k;
    int64_t ndict;
} dcol_t;

/* What the decoder works in: buffers reused from page to page and row group
 * to row group, freed with the decoded columns by data_pq_release. */
typedef struct {
    unsigned char *chunk_buf, *page_buf; /* a column chunk's bytes; a page decompressed */
    size_t chunk_cap, page_cap;
    uint32_t *rep, *def; /* [rep_cap], [def_cap] levels of one page */
    int64_t rep_cap, def_cap;
    int64_t *vk; /* [vk_cap] one page's values as keys (categorical) */
    float *vf;   /* [vf_cap] one page's values as floats (label, dense) */
    int64_t vk_cap, vf_cap;
    uint32_t *ids;           /* [ids_cap] one page's dictionary indices */
    int64_t ids_cap;
    int64_t *dbp, dbp_cap;   /* DELTA_BINARY_PACKED output */
    int64_t *dbp2, dbp2_cap; /* DELTA_BYTE_ARRAY's second stream */
    unsigned char *prev;     /* DELTA_BYTE_ARRAY: the previous value */
    size_t prev_cap;
    ZSTD_DCtx *zd;           /* kept: a context per page would cost more than the page */
    z_stream zs;             /* kept, reset per page */
    bool zs_init;
} scratch_t;

struct data_pq_file {
    char *path;
    int fd;
    int64_t size;
    int ncols;       /* 1 + ndense + nslots */
    col_t *cols;     /* [ncols] */
    char **names;    /* [ncols] owned copies of the mapped names */
    int nleaves;
    int nrg;
    int64_t nrows;
    int64_t *rg_start; /* [nrg + 1] first row of each row group */
    chunk_t *chunks;   /* [nrg * ncols] */
    /* footer parsing: the row group being read */
    int rg_fill;
    bool rg_bad_chunk;
    char rg_why[160];
    /* the decoded row group */
    int cur_rg; /* -1: none */
    dcol_t *dc; /* [ncols] */
    int64_t dc_rows_cap;
    scratch_t *sc; /* [nsc] the decoders' buffers, one per thread, reused page to page */
    int nsc;
    bool team;     /* decode a row group's columns on the caller's OpenMP threads */
};

void data_pq_set_team(data_pq_file_t *f, bool team)
{
    f->team = team;
}

int64_t data_pq_rows(const data_pq_file_t *f)
{
    return f->nrows;
}

/* The row-group array is filled as the footer is walked. */
typedef struct {
    data_pq_file_t *f;
    int64_t num_rows;
    int ncc; /* column chunks seen */
} rg_ctx_t;

static bool rg_columns(tc_t *t, rg_ctx_t *g)
{
    int et;
    int64_t n;
    data_pq_file_t *f = g->f;
    if (!tc_list(t, &et, &n) || et != TT_STRUCT)
        return false;
    for (int64_t i = 0; i < n; i++) {
        colchunk_t cc;
        memset(&cc, 0, sizeof cc);
        if (!tc_struct(t, colchunk_field, &cc))
            return false;
        for (int c = 0; c < f->ncols; c++) {
            if (f->cols[c].leaf != (int)i)
                continue;
            chunk_t *ch = &f->chunks[(size_t)g->f->rg_fill * (size_t)f->ncols + (size_t)c];
            const colmeta_t *m = &cc.meta;
            if (!cc.has_meta || cc.external) {
                snprintf(f->rg_why, sizeof f->rg_why, "column %s: %s", f->cols[c].name,
                         cc.external ? "its chunk lives in another file (file_path), which "
                                       "Kiln does not follow"
                                     : "no column metadata");
                f->rg_bad_chunk = true;
                continue;
            }
            ch->start = m->has_dict && m->dict_off > 0 && m->dict_off < m->data_off ? m->dict_off
                                                                                     : m->data_off;
            ch->size = m->size;
            ch->num_values = m->num_values;
            ch->codec = m->codec;
            ch->type = m->type;
        }
    }
    g->ncc = (int)n;
    return true;
}

static bool rowgroup_field(tc_t *t, int16_t id, int type, void *arg)
{
    rg_ctx_t *g = arg;
    if (id == 1 && type == TT_LIST)
        return rg_columns(t, g);
    if (id == 3)
        return read_int(t, type, 0, INT64_MAX, &g->num_rows);
    return tc_skip(t, type);
}

/* The footer's walk state: the schema and the row groups. */
typedef struct {
    data_pq_file_t *f;
    bool want_rgs; /* the second walk: the schema is known, read the row groups */
    schema_el_t *schema;
    int64_t nschema;
    int64_t num_rows;
    bool have_schema, have_rgs, nomem;
} fmd_t;

static bool fmd_row_groups(tc_t *t, fmd_t *m)
{
    data_pq_file_t *f = m->f;
    int et;
    int64_t n;
    if (!tc_list(t, &et, &n) || et != TT_STRUCT)
        return false;
    f->rg_start = kiln_calloc((size_t)n + 1, sizeof *f->rg_start);
    f->chunks = kiln_calloc(((size_t)n + 1) * (size_t)f->ncols, sizeof *f->chunks);
    if (f->rg_start == NULL || f->chunks == NULL) {
        m->nomem = true;
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        rg_ctx_t g = {.f = f, .num_rows = -1};
        f->rg_fill = (int)i;
        if (!tc_struct(t, rowgroup_field, &g) || g.num_rows < 0)
            return tc_fail(t);
        if (g.ncc != f->nleaves) {
            snprintf(f->rg_why, sizeof f->rg_why,
                     "row group %lld has %d column chunks, the schema %d leaf columns",
                     (long long)i, g.ncc, f->nleaves);
            f->rg_bad_chunk = true;
        }
        if (g.num_rows > PQ_MAX_RG_ROWS) {
            snprintf(f->rg_why, sizeof f->rg_why,
                     "row group %lld has %lld rows, more than Kiln reads in one (%lld); rewrite "
                     "the file with smaller row groups",
                     (long long)i, (long long)g.num_rows, (long long)PQ_MAX_RG_ROWS);
            f->rg_bad_chunk = true;
        }
        if (g.num_rows > INT64_MAX - f->rg_start[i])
            return tc_fail(t);
        f->rg_start[i + 1] = f->rg_start[i] + g.num_rows;
    }
    f->nrg = (int)n;
    m->have_rgs = true;
    return true;
}

static bool fmd_field(tc_t *t, int16_t id, int type, void *arg)
{
    fmd_t *m = arg;
    if (id == 2 && type == TT_LIST && !m->want_rgs) {
        int et;
        if (m->have_schema)
            return false; /* the schema twice */
        if (!tc_list(t, &et, &m->nschema) || et != TT_STRUCT || m->nschema > PQ_MAX_LEAVES)
            return false;
        m->schema = kiln_calloc((size_t)m->nschema + 1, sizeof *m->schema);
        if (m->schema == NULL) {
            m->nomem = true;
            return false;
        }
        for (int64_t i = 0; i < m->nschema; i++) {
            m->schema[i].type = -1;
            m->schema[i].converted = -1;
            if (!tc_struct(t, schema_field, &m->schema[i]))
                return false;
        }
        m->have_schema = true;
        return true;
    }
    if (id == 3)
        return read_int(t, type, 0, INT64_MAX, &m->num_rows);
    if (id == 4 && type == TT_LIST && m->want_rgs)
        return !m->have_rgs && fmd_row_groups(t, m); /* not twice */
    return tc_skip(t, type);
}

/* Flattens the schema tree (depth first) into leaves with their levels.
 * Returns the leaf count or -1 when the tree is malformed. */
static int flatten(const schema_el_t *s, int64_t ns, int64_t *i, int def, int rep,
                   const char *top, int depth, leaf_t *leaves, int nleaves)
{
    if (*i >= ns || depth > THRIFT_MAX_DEPTH)
        return -1;
    const schema_el_t *e = &s[(*i)++];
    if (depth > 0) {
        def += e->rep != REP_REQUIRED;
        rep += e->rep == REP_REPEATED;
        if (depth == 1)
            top = e->name;
    }
    if (e->nchildren == 0) {
        if (depth == 0 || e->type < 0 || nleaves >= PQ_MAX_LEAVES)
            return -1;
        leaf_t *l = &leaves[nleaves];
        snprintf(l->top, sizeof l->top, "%s", top);
        l->type = e->type;
        l->converted = e->converted;
        l->scale = e->scale;
        l->max_def = def;
        l->max_rep = rep;
        return nleaves + 1;
    }
    for (int c = 0; c < e->nchildren; c++) {
        nleaves = flatten(s, ns, i, def, rep, top, depth + 1, leaves, nleaves);
        if (nleaves < 0)
            return -1;
    }
    return nleaves;
}

static int corrupt_footer(const data_pq_file_t *f, const char *why)
{
    return kiln_errf(KILN_ECORRUPT,
                     "Parquet file %s: the footer does not decode (%s); the file is damaged or "
                     "not written by a Parquet writer: rewrite it",
                     f->path, why);
}

static int pread_full(const data_pq_file_t *f, void *buf, size_t n, int64_t off)
{
    char *c = buf;
    while (n > 0) {
        ssize_t r = pread(f->fd, c, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return kiln_errf(KILN_EIO, "cannot read Parquet file %s: %s", f->path,
                             strerror(errno));
        if (r == 0)
            return kiln_errf(KILN_ECORRUPT, "Parquet file %s ends at byte %lld, inside a "
                             "column chunk: it was cut short while being read", f->path,
                             (long long)off);
        c += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

static const char *const default_prefix[] = {"label", "I", "C"};

/* Fills f->cols / f->names from the mapping. */
static int map_columns(data_pq_file_t *f, const data_columns_t *cols, int ndense, int nslots)
{
    f->ncols = 1 + ndense + nslots;
    f->cols = kiln_calloc((size_t)f->ncols, sizeof *f->cols);
    f->names = kiln_calloc((size_t)f->ncols, sizeof *f->names);
    if (f->cols == NULL || f->names == NULL)
        return KILN_ENOMEM;
    for (int c = 0; c < f->ncols; c++) {
        col_t *col = &f->cols[c];
        const char *given = NULL;
        col->role = c == 0 ? ROLE_LABEL : c <= ndense ? ROLE_DENSE : ROLE_CAT;
        col->index = c == 0 ? 0 : c <= ndense ? c - 1 : c - 1 - ndense;
        if (cols != NULL)
            given = col->role == ROLE_LABEL  ? cols->label
                    : col->role == ROLE_DENSE ? (cols->dense ? cols->dense[col->index] : NULL)
                                              : (cols->categorical ? cols->categorical[col->index]
                                                                   : NULL);
        f->names[c] = given ? kiln_strdup(given)
                      : col->role == ROLE_LABEL
                          ? kiln_strdup(default_prefix[0])
                          : kiln_asprintf("%s%d", default_prefix[col->role], col->index + 1);
        if (f->names[c] == NULL)
            return KILN_ENOMEM;
        col->name = f->names[c];
        col->leaf = -1;
    }
    return 0;
}

/* Which physical types each role reads, and why not the others. */
static bool type_fits(role_t role, int type)
{
    switch (type) {
    case PT_INT32:
    case PT_INT64:
        return true;
    case PT_BOOLEAN:
    case PT_FLOAT:
    case PT_DOUBLE:
        return role != ROLE_CAT;
    case PT_BYTE_ARRAY:
        return role == ROLE_CAT;
    default:
        return false;
    }
}

static const char *const role_names[] = {"label", "dense", "categorical"};

/* Finds every mapped column among the leaves and checks its type. */
static int bind_columns(data_pq_file_t *f, const leaf_t *leaves, const data_columns_t *cols)
{
    data_dense_transform_t tf = cols ? cols->dense_transform : DATA_DENSE_AUTO;
    for (int c = 0; c < f->ncols; c++) {
        col_t *col = &f->cols[c];
        int found = -1, nfound = 0;
        for (int l = 0; l < f->nleaves; l++)
            if (strcmp(leaves[l].top, col->name) == 0) {
                found = found < 0 ? l : found;
                nfound++;
            }
        if (found < 0)
            return kiln_errf(KILN_EINVAL,
                             "Parquet file %s has no column '%s' (mapped as %s column %d): "
                             "check data.columns in the job spec against the file's schema",
                             f->path, col->name, role_names[col->role], col->index);
        const leaf_t *l = &leaves[found];
        if (nfound > 1 || l->max_rep > 1 || (l->max_rep == 1 && col->role != ROLE_CAT))
            return kiln_errf(KILN_EINVAL,
                             "Parquet file %s: column '%s' is %s, but a %s column must hold %s: "
                             "map another column or flatten it in the writer",
                             f->path, col->name,
                             nfound > 1 ? "a struct of several columns"
                             : l->max_rep > 1 ? "a list nested in a list"
                                              : "a list",
                             role_names[col->role],
                             col->role == ROLE_CAT ? "one value or one list of values per row"
                                                   : "one value per row");
        if (!type_fits(col->role, l->type))
            return kiln_errf(KILN_EINVAL,
                             "Parquet file %s: column '%s' is %s, which a %s column cannot be "
                             "read from (%s): map another column or cast it in the writer",
                             f->path, col->name, NAME_OF(type_names, l->type),
                             role_names[col->role],
                             col->role == ROLE_CAT
                                 ? "categorical columns are INT32, INT64 or BYTE_ARRAY"
                                 : "label and dense columns are BOOLEAN, INT32, INT64, FLOAT or "
                                   "DOUBLE");
        col->leaf = found;
        col->type = l->type;
        col->max_def = l->max_def;
        col->max_rep = l->max_rep;
        col->is_unsigned = l->converted >= CT_UINT_8 && l->converted <= CT_UINT_64;
        col->decimal = l->converted == CT_DECIMAL ? pow(10.0, -l->scale) : 0.0;
        /* A DECIMAL is a fraction: auto leaves it as floats are left. */
        bool is_float = l->type == PT_FLOAT || l->type == PT_DOUBLE || col->decimal != 0.0;
        col->log1p = tf == DATA_DENSE_LOG1P || (tf == DATA_DENSE_AUTO && !is_float);
    }
    return 0;
}

/* Reads the last 8 bytes and the footer into a buffer. */
static int read_footer(data_pq_file_t *f, unsigned char **out, int64_t *len)
{
    unsigned char tail[8], head[4];
    if (f->size < 12)
        return kiln_errf(KILN_EBUSY,
                         "Parquet file %s is %lld bytes, too short to be complete (a Parquet "
                         "file starts and ends with PAR1): it is cut short or still being "
                         "written; wait for the writer to finish or rewrite it",
                         f->path, (long long)f->size);
    KILN_CHECK(pread_full(f, head, 4, 0));
    KILN_CHECK(pread_full(f, tail, 8, f->size - 8));
    if (memcmp(head, "PAR1", 4) != 0)
        return kiln_errf(KILN_EINVAL, "%s does not start with PAR1: it is not a Parquet file "
                         "(data.format is parquet)", f->path);
    if (memcmp(tail + 4, "PAR1", 4) != 0)
        return kiln_errf(KILN_EBUSY,
                         "Parquet file %s does not end with PAR1: it is cut short or still "
                         "being written (a writer adds the footer last); wait for the writer "
                         "to finish or rewrite it",
                         f->path);
    uint32_t flen;
    memcpy(&flen, tail, 4);
    if ((int64_t)flen > f->size - 12 || (int64_t)flen > PQ_MAX_FOOTER || flen == 0)
        return kiln_errf(KILN_ECORRUPT,
                         "Parquet file %s: its footer length (%u bytes) is past the file's "
                         "%lld bytes: the file is damaged; rewrite it",
                         f->path, flen, (long long)f->size);
    *out = kiln_malloc(flen);
    if (*out == NULL)
        return KILN_ENOMEM;
    *len = flen;
    int rc = pread_full(f, *out, flen, f->size - 8 - flen);
    if (rc < 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

/* Checks the row-group table against the file: sizes, offsets, types. */
static int check_chunks(data_pq_file_t *f, int64_t num_rows)
{
    if (f->rg_bad_chunk)
        return corrupt_footer(f, f->rg_why);
    if (f->rg_start[f->nrg] != num_rows) {
        snprintf(f->rg_why, sizeof f->rg_why, "its row groups hold %lld rows, its header %lld",
                 (long long)f->rg_start[f->nrg], (long long)num_rows);
        return corrupt_footer(f, f->rg_why);
    }
    for (int g = 0; g < f->nrg; g++)
        for (int c = 0; c < f->ncols; c++) {
            const chunk_t *ch = &f->chunks[(size_t)g * (size_t)f->ncols + (size_t)c];
            int64_t rows = f->rg_start[g + 1] - f->rg_start[g];
            const char *why = NULL;
            if (ch->start < 4 || ch->size <= 0 || ch->size > f->size || ch->start > f->size - 8 - ch->size)
                why = "its byte range lies outside the file";
            else if (ch->type != f->cols[c].type)
                why = "its type differs from the schema's";
            else if (f->cols[c].max_rep == 0 && ch->num_values != rows)
                why = "its value count differs from the row group's rows";
            else if (ch->num_values > PQ_MAX_CHUNK_VALUES)
                why = "it holds more values than Kiln reads in one column chunk (64M)";
            if (rows > 0 && why != NULL) {
                snprintf(f->rg_why, sizeof f->rg_why, "row group %d, column %s: %s", g,
                         f->cols[c].name, why);
                return corrupt_footer(f, f->rg_why);
            }
        }
    return 0;
}

int data_pq_open(const char *path, const data_columns_t *cols, int ndense, int nslots,
               data_pq_file_t **out)
{
    data_pq_file_t *f = kiln_calloc(1, sizeof *f);
    unsigned char *footer = NULL;
    int64_t flen = 0;
    fmd_t m = {0};
    leaf_t *leaves = NULL;
    struct stat sb;
    int rc;
    if (f == NULL)
        return KILN_ENOMEM;
    f->fd = -1;
    f->cur_rg = -1;
    f->path = kiln_strdup(path);
    if (f->path == NULL) {
        rc = KILN_ENOMEM;
        goto fail;
    }
    KILN_CHECK_GOTO(data_open(path, &f->fd), rc, fail);
    if (fstat(f->fd, &sb) < 0) {
        rc = kiln_errf(KILN_EIO, "cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    f->size = sb.st_size;
    KILN_CHECK_GOTO(map_columns(f, cols, ndense, nslots), rc, fail);
    KILN_CHECK_GOTO(read_footer(f, &footer, &flen), rc, fail);

    /* The schema first (the leaves give the mapped columns' chunk
     * indices), then the row groups: two walks, since a writer may order
     * the fields freely. */
    tc_t t = {.p = footer, .end = footer + flen};
    m = (fmd_t){.f = f, .num_rows = -1};
    if (!tc_struct(&t, fmd_field, &m) || !m.have_schema || m.num_rows < 0) {
        rc = m.nomem ? KILN_ENOMEM
                     : corrupt_footer(f, m.have_schema ? "the FileMetaData struct is malformed"
                                                       : "no schema");
        goto fail;
    }
    leaves = kiln_calloc((size_t)m.nschema + 1, sizeof *leaves);
    if (leaves == NULL) {
        rc = KILN_ENOMEM;
        goto fail;
    }
    int64_t si = 0;
    f->nleaves = m.nschema > 0 ? flatten(m.schema, m.nschema, &si, 0, 0, "", 0, leaves, 0) : -1;
    if (f->nleaves < 0 || si != m.nschema) {
        rc = corrupt_footer(f, "the schema tree is malformed");
        goto fail;
    }
    KILN_CHECK_GOTO(bind_columns(f, leaves, cols), rc, fail);

    schema_el_t *schema = m.schema;
    m = (fmd_t){.f = f, .want_rgs = true, .schema = schema, .num_rows = -1};
    t = (tc_t){.p = footer, .end = footer + flen};
    if (!tc_struct(&t, fmd_field, &m) || !m.have_rgs) {
        rc = m.nomem ? KILN_ENOMEM : corrupt_footer(f, "the row groups are malformed");
        goto fail;
    }
    KILN_CHECK_GOTO(check_chunks(f, m.num_rows), rc, fail);
    f->nrows = m.num_rows;
    f->dc = kiln_calloc((size_t)f->ncols, sizeof *f->dc);
    if (f->dc == NULL) {
        rc = KILN_ENOMEM;
        goto fail;
    }
    free(m.schema);
    free(leaves);
    free(footer);
    *out = f;
    return 0;
fail:
    free(m.schema);
    free(leaves);
    free(footer);
    data_pq_close(f);
    return rc;
}

static void dcol_fini(dcol_t *d)
{
    KILN_FREE_ALL(d->f, d->cnt, d->keys, d->ids, d->dict_f, d->dict_k);
}

void data_pq_close(data_pq_file_t *f)
{
    if (f == NULL)
        return;
    if (f->fd >= 0)
        close(f->fd);
    for (int c = 0; f->names && c < f->ncols; c++)
        free(f->names[c]);
    data_pq_release(f);
    KILN_FREE_ALL(f->path, f->cols, f->names, f->rg_start, f->chunks, f->dc);
    free(f);
}

static void scratch_fini(scratch_t *sc)
{
    ZSTD_freeDCtx(sc->zd);
    if (sc->zs_init)
        inflateEnd(&sc->zs);
    KILN_FREE_ALL(sc->chunk_buf, sc->page_buf, sc->rep, sc->def, sc->vk, sc->vf, sc->ids,
                  sc->dbp, sc->dbp2, sc->prev);
}

void data_pq_release(data_pq_file_t *f)
{
    for (int c = 0; f->dc && c < f->ncols; c++) {
        dcol_fini(&f->dc[c]);
        memset(&f->dc[c], 0, sizeof f->dc[c]);
    }
    f->dc_rows_cap = 0;
    f->cur_rg = -1;
    for (int i = 0; i < f->nsc; i++)
        scratch_fini(&f->sc[i]);
    free(f->sc);
    f->sc = NULL;
    f->nsc = 0;
}

int data_pq_same_schema(const data_pq_file_t *a, const data_pq_file_t *b)
{
    for (int c = 0; c < a->ncols && c < b->ncols; c++) {
        const col_t *x = &a->cols[c], *y = &b->cols[c];
        if (x->type != y->type || x->max_rep != y->max_rep || x->max_def != y->max_def)
            return kiln_errf(KILN_EINVAL,
                             "Parquet files %s and %s of one job differ in column '%s' (%s%s vs "
                             "%s%s): every partition must have the same schema; rewrite the odd "
                             "one or train them in separate jobs",
                             a->path, b->path, x->name, NAME_OF(type_names, x->type),
                             x->max_rep ? " list" : x->max_def ? " nullable" : "",
                             NAME_OF(type_names, y->type),
                             y->max_rep ? " list" : y->max_def ? " nullable" : "");
    }
    return 0;
}

/* ---- page decoding ---------------------------------------------------------------- */

/* Where a page is, for messages, and the scratch decoding it. */
typedef struct {
    data_pq_file_t *f;
    scratch_t *sc;
    const col_t *col;
    int rg;
    int64_t at; /* file offset of the page header */
} where_t;

static int bad_page(const where_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int bad_page(const where_t *w, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return kiln_errf(KILN_ECORRUPT,
                     "Parquet file %s, row group %d, column %s, page at byte %lld: %s; nothing "
                     "is trained from this file: rewrite it",
                     w->f->path, w->rg, w->col->name, (long long)w->at, why);
}

static int unsupported(const where_t *w, const char *what, const char *name, int v)
{
    return kiln_errf(KILN_EINVAL,
                     "Parquet file %s, row group %d, column %s: %s %s (%d) is not one Kiln reads "
                     "(docs/data-formats.md, \"Parquet\"); rewrite the file with another %s",
                     w->f->path, w->rg, w->col->name, what, name, v, what);
}

/* Grows *p (elements of elem bytes, capacity *cap) to hold n. */
static int grow(void *p, int64_t *cap, int64_t n, size_t elem)
{
    return n <= *cap ? 0 : kiln_grow_to((void **)p, cap, n, elem, 1024);
}

static int grow_bytes(unsigned char **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 4096;
    while (nc < n)
        nc *= 2;
    unsigned char *q = realloc(*p, nc);
    if (q == NULL)
        return kiln_errf(KILN_ENOMEM, "out of memory for a %zu-byte Parquet buffer", n);
    *p = q;
    *cap = nc;
    return 0;
}

/* Decompresses src[n] into the scratch's page_buf, which must end up exactly want
 * bytes long. Returns 0 or an error. */
static int decompress(const where_t *w, int codec, const unsigned char *src, size_t n,
                      size_t want, const unsigned char **out)
{
    scratch_t *sc = w->sc;
    if (codec == CODEC_NONE) {
        if (n != want)
            return bad_page(w, "an uncompressed page of %zu bytes says it holds %zu", n, want);
        *out = src;
        return 0;
    }
    KILN_CHECK(grow_bytes(&sc->page_buf, &sc->page_cap, want + 1));
    size_t got = 0;
    if (codec == CODEC_SNAPPY) {
        size_t len;
        if (snappy_uncompressed_length((const char *)src, n, &len) != SNAPPY_OK || len != want ||
            snappy_uncompress((const char *)src, n, (char *)sc->page_buf, &len) != SNAPPY_OK)
            return bad_page(w, "the SNAPPY data does not decompress to %zu bytes", want);
        got = len;
    } else if (codec == CODEC_GZIP) {
        if (!sc->zs_init) {
            if (inflateInit2(&sc->zs, 15 + 32) != Z_OK)
                return kiln_errf(KILN_ENOMEM, "cannot start a gzip decoder");
            sc->zs_init = true;
        } else {
            inflateReset(&sc->zs);
        }
        sc->zs.next_in = (Bytef *)src;
        sc->zs.avail_in = (uInt)n;
        sc->zs.next_out = sc->page_buf;
        sc->zs.avail_out = (uInt)want + 1;
        int zr = inflate(&sc->zs, Z_FINISH);
        got = want + 1 - sc->zs.avail_out;
        if (zr != Z_STREAM_END)
            return bad_page(w, "the GZIP data does not decompress (%s)", zError(zr));
    } else if (codec == CODEC_ZSTD) {
        if (sc->zd == NULL && (sc->zd = ZSTD_createDCtx()) == NULL)
            return kiln_errf(KILN_ENOMEM, "cannot start a zstd decoder");
        size_t zr = ZSTD_decompressDCtx(sc->zd, sc->page_buf, want + 1, src, n);
        if (ZSTD_isError(zr))
            return bad_page(w, "the ZSTD data does not decompress (%s)", ZSTD_getErrorName(zr));
        got = zr;
    } else {
        return unsupported(w, "codec", NAME_OF(codec_names, codec), codec);
    }
    if (got != want)
        return bad_page(w, "the page decompresses to %zu bytes, its header says %zu", got, want);
    *out = sc->page_buf;
    return 0;
}

/* The bw bits (<= 64) at bit offset `bit` of p, least significant first,
 * read a bit at a time (touching only the bytes that hold them). */
static uint64_t bits_at(const unsigned char *p, uint64_t bit, int bw)
{
    uint64_t v = 0;
    for (int k = 0; k < bw; k++, bit++)
        v |= (uint64_t)((p[bit >> 3] >> (bit & 7)) & 1) << k;
    return v;
}

/* Parquet's bit packing: n values of bw bits, least significant bit first,
 * from p, which holds at least ceil(n * bw / 8) bytes (and no more are
 * read). A 64-bit accumulator takes a byte whenever it holds fewer than bw
 * bits, so bw up to 56 streams; wider values (DELTA_BINARY_PACKED only)
 * take two halves. */
static void unpack_bits(const unsigned char *p, int bw, uint64_t *out, int64_t n)
{
    if (bw == 0) {
        memset(out, 0, (size_t)n * sizeof *out);
        return;
    }
    if (bw > 56) {
        for (int64_t i = 0; i < n; i++)
            out[i] = bits_at(p, (uint64_t)i * (uint64_t)bw, bw);
        return;
    }
    const uint64_t mask = (UINT64_C(1) << bw) - 1;
    uint64_t acc = 0;
    int bits = 0;
    for (int64_t i = 0; i < n; i++) {
        while (bits < bw) {
            acc |= (uint64_t)*p++ << bits;
            bits += 8;
        }
        out[i] = acc & mask;
        acc >>= bw;
        bits -= bw;
    }
}

/* A byte's eight bits as eight 32-bit values, least significant first. */
#define BITS8(b)                                                                                   \
    {(b) & 1, (b) >> 1 & 1, (b) >> 2 & 1, (b) >> 3 & 1, (b) >> 4 & 1, (b) >> 5 & 1, (b) >> 6 & 1,  \
     (b) >> 7 & 1}
#define BITS8_2(b) BITS8(b), BITS8((b) + 1)
#define BITS8_8(b) BITS8_2(b), BITS8_2((b) + 2), BITS8_2((b) + 4), BITS8_2((b) + 6)
#define BITS8_32(b) BITS8_8(b), BITS8_8((b) + 8), BITS8_8((b) + 16), BITS8_8((b) + 24)
static const uint32_t bits8[256][8] = {BITS8_32(0),   BITS8_32(32),  BITS8_32(64),
                                       BITS8_32(96),  BITS8_32(128), BITS8_32(160),
                                       BITS8_32(192), BITS8_32(224)};

/* Eight values of bw (2..32) bits, least significant bit first, from the
 * bw bytes at p; each value one 8-byte load, so p must have 8 readable
 * bytes past the eighth value's first. */
static inline __attribute__((always_inline)) void unpack8(const unsigned char *p, int bw,
                                                          uint32_t mask, uint32_t *out)
{
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        uint64_t w;
        memcpy(&w, p + ((k * bw) >> 3), 8);
        out[k] = (uint32_t)(w >> ((k * bw) & 7)) & mask;
    }
}

/* unpack_bits into 32-bit values (levels, dictionary indices: bw <= 32).
 * Width 1 (the levels of a nullable column) copies a byte's eight values
 * from bits8. */
static void unpack_bits32(const unsigned char *p, int bw, uint32_t *out, int64_t n)
{
    if (bw == 1) {
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            memcpy(out + i, bits8[p[i >> 3]], sizeof bits8[0]);
        for (; i < n; i++)
            out[i] = (p[i >> 3] >> (i & 7)) & 1u;
        return;
    }
    if (bw == 0) {
        memset(out, 0, (size_t)n * sizeof *out);
        return;
    }
    /* Value i starts at bit i * bw: one 8-byte little-endian load at its
     * byte holds all of it (an offset below 8 in the byte, plus bw <= 32),
     * so values decode independently, with no branch a byte. Eight values
     * (bw bytes) at a time while their loads stay inside the
     * ceil(n * bw / 8) bytes the caller vouches for; the rest from a
     * zero-padded copy of the bytes left. */
    const uint64_t nbytes = ((uint64_t)n * (uint64_t)bw + 7) / 8;
    const uint32_t mask = bw == 32 ? UINT32_MAX : ((uint32_t)1 << bw) - 1;
    int64_t i = 0;
    uint64_t at = 0; /* the byte value i starts at (i a multiple of 8) */
    for (; i + 8 <= n && at + (uint64_t)bw + 8 <= nbytes; i += 8, at += (uint64_t)bw)
        unpack8(p + at, bw, mask, out + i);
    if (i < n) {
        /* fewer than bw + 8 bytes left, so fewer than 8 + 64 / bw values: their
         * groups' loads end before 2 bw + 16 bytes */
        unsigned char tail[2 * 32 + 16] = {0};
        memcpy(tail, p + at, (size_t)(nbytes - at));
        for (int64_t k = 0; i + k < n; k += 8) {
            uint32_t v[8];
            unpack8(tail + (uint64_t)(k / 8) * (uint64_t)bw, bw, mask, v);
            memcpy(out + i + k, v, (size_t)(n - i - k < 8 ? n - i - k : 8) * sizeof *v);
        }
    }
}

static bool varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
    tc_t t = {.p = *p, .end = end};
    if (!tc_varint(&t, v))
        return false;
    *p = t.p;
    return true;
}

/* The RLE / bit-packed hybrid: n values of bw bits from [p, end). Returns
 * the end of what was read, or NULL when the data runs out or is bad. */
static const unsigned char *rle_decode(const unsigned char *p, const unsigned char *end, int bw,
                                       uint32_t *out, int64_t n)
{
    int64_t i = 0;
    if (bw < 0 || bw > 32)
        return NULL;
    while (i < n) {
        uint64_t h;
        if (!varint(&p, end, &h))
            return NULL;
        if (h & 1) {
            uint64_t groups = h >> 1; /* of 8 values; the bytes are checked below */
            if (groups == 0 || groups > (UINT64_C(1) << 40))
                return NULL;
            uint64_t vals = groups * 8, bytes = groups * (uint64_t)bw;
            int64_t take = (int64_t)vals < n - i ? (int64_t)vals : n - i;
            /* The last run may stop short of its padding at the page's end. */
            uint64_t avail = bytes < (uint64_t)(end - p) ? bytes : (uint64_t)(end - p);
            if ((uint64_t)take * (uint64_t)bw > avail * 8)
                return NULL;
            unpack_bits32(p, bw, out + i, take);
            i += take;
            p += avail;
        } else {
            uint64_t run = h >> 1;
            int nb = (bw + 7) / 8;
            uint32_t v = 0;
            if (end - p < nb)
                return NULL;
            for (int k = 0; k < nb; k++)
                v |= (uint32_t)p[k] << (8 * k);
            p += nb;
            if (bw < 32 && (v >> bw) != 0)
                return NULL;
            int64_t take = (int64_t)run < n - i ? (int64_t)run : n - i;
            for (int64_t k = 0; k < take; k++)
                out[i + k] = v;
            i += take;
        }
    }
    return p;
}

static int bit_width(int64_t max)
{
    int bw = 0;
    while (max > 0) {
        bw++;
        max >>= 1;
    }
    return bw;
}

/* DELTA_BINARY_PACKED: decodes every value of the stream at [*p, end) into
 * *out (grown), at most max_count of them. Sets *p past the stream and *n. */
static int dbp_decode(const where_t *w, const unsigned char **pp, const unsigned char *end,
                      int64_t max_count, int64_t **out, int64_t *cap, int64_t *n)
{
    const unsigned char *p = *pp;
    uint64_t block, minis, count;
    int64_t first;
    tc_t t;
    if (!varint(&p, end, &block) || !varint(&p, end, &minis) || !varint(&p, end, &count))
        return bad_page(w, "a DELTA_BINARY_PACKED header does not decode");
    t = (tc_t){.p = p, .end = end};
    if (!tc_zigzag(&t, &first))
        return bad_page(w, "a DELTA_BINARY_PACKED header does not decode");
    p = t.p;
    if (block == 0 || block % 128 != 0 || minis == 0 || block % minis != 0 ||
        (block / minis) % 32 != 0 || block > (1u << 20) || count > (uint64_t)max_count)
        return bad_page(w, "a DELTA_BINARY_PACKED header is invalid (block %llu, miniblocks "
                        "%llu, %llu values)", (unsigned long long)block,
                        (unsigned long long)minis, (unsigned long long)count);
    KILN_CHECK(grow(out, cap, (int64_t)count + 1, sizeof(int64_t)));
    int64_t *o = *out;
    uint64_t per_mini = block / minis;
    uint64_t v = (uint64_t)first, i = 0;
    if (count > 0)
        o[i++] = first;
    while (i < count) {
        int64_t min_delta;
        t = (tc_t){.p = p, .end = end};
        if (!tc_zigzag(&t, &min_delta) || (uint64_t)(end - t.p) < minis)
            return bad_page(w, "a DELTA_BINARY_PACKED block header runs past the page");
        p = t.p;
        const unsigned char *widths = p;
        p += minis;
        for (uint64_t mb = 0; mb < minis && i < count; mb++) {
            int bw = widths[mb];
            if (bw > 64)
                return bad_page(w, "a DELTA_BINARY_PACKED miniblock is %d bits wide", bw);
            uint64_t bytes = per_mini * (uint64_t)bw / 8;
            if (bytes > (uint64_t)(end - p))
                return bad_page(w, "a DELTA_BINARY_PACKED miniblock runs past the page");
            uint64_t take = per_mini < count - i ? per_mini : count - i;
            unpack_bits(p, bw, (uint64_t *)o + i, (int64_t)take);
            for (uint64_t k = 0; k < take; k++) {
                v += (uint64_t)min_delta + (uint64_t)o[i];
                o[i++] = (int64_t)v;
            }
            p += bytes;
        }
    }
    *pp = p;
    *n = (int64_t)count;
    return 0;
}

/* The value conversions: what a categorical, dense or label column makes
 * of a raw integer, float or string. */
static inline int64_t cat_int(int64_t v)
{
    return (int64_t)((uint64_t)v & (uint64_t)DATA_KEY_MASK);
}

static inline float num_of_int(const col_t *c, int64_t v)
{
    if (c->role == ROLE_LABEL)
        return v == 0 || v == 1 ? (float)v : NAN;
    return c->log1p ? data_dense_int(v) : (float)v;
}

static inline float num_of_dbl(const col_t *c, double v)
{
    if (c->role == ROLE_LABEL)
        return v == 0.0 || v == 1.0 ? (float)v : NAN;
    if (isnan(v))
        return 0.0f;
    if (c->log1p)
        return v > 0 ? (float)log1p(v) : 0.0f;
    return (float)v;
}

/* The n values of one page (or dictionary) in [p, end) with encoding enc,
 * converted: into k (categorical keys) or fl (label / dense). */
typedef struct {
    const col_t *col;
    int64_t *k; /* [n] when col is categorical */
    float *fl;  /* [n] otherwise */
} sink_t;

static void put_int(const sink_t *s, int64_t i, int64_t v)
{
    const col_t *c = s->col;
    if (c->is_unsigned && c->type == PT_INT32)
        v = (int64_t)(uint32_t)v;
    if (c->role == ROLE_CAT)
        s->k[i] = cat_int(v);
    else if (c->decimal != 0.0)
        s->fl[i] = num_of_dbl(c, (double)v * c->decimal);
    else if (c->is_unsigned && v < 0) /* a UINT_64 past INT64_MAX */
        s->fl[i] = num_of_dbl(c, (double)(uint64_t)v);
    else
        s->fl[i] = num_of_int(c, v);
}

static void put_bytes(const sink_t *s, int64_t i, const unsigned char *v, size_t len)
{
    s->k[i] = data_key_hash(s->col->index, (const char *)v, len);
}

/* PLAIN values. */
static int decode_plain(const where_t *w, const sink_t *s, const unsigned char *p,
                        const unsigned char *end, int64_t n)
{
    const int type = s->col->type;
    const size_t len = (size_t)(end - p);
    if (type == PT_BOOLEAN) {
        if ((uint64_t)n > len * 8)
            return bad_page(w, "%lld PLAIN booleans need more than the page's %zu bytes",
                            (long long)n, len);
        for (int64_t i = 0; i < n; i++)
            put_int(s, i, (p[i >> 3] >> (i & 7)) & 1);
        return 0;
    }
    if (type == PT_BYTE_ARRAY) {
        for (int64_t i = 0; i < n; i++) {
            uint32_t l;
            if (end - p < 4)
                return bad_page(w, "PLAIN string %lld runs past the page", (long long)i);
            memcpy(&l, p, 4);
            p += 4;
            if (l > (uint64_t)(end - p))
                return bad_page(w, "PLAIN string %lld (%u bytes) runs past the page",
                                (long long)i, l);
            put_bytes(s, i, p, l);
            p += l;
        }
        return 0;
    }
    size_t width = type == PT_INT32 || type == PT_FLOAT ? 4 : 8;
    if ((uint64_t)n > len / width)
        return bad_page(w, "%lld PLAIN %s values need %llu bytes, the page has %zu", (long long)n,
                        NAME_OF(type_names, type), (unsigned long long)n * width, len);
    for (int64_t i = 0; i < n; i++, p += width) {
        if (type == PT_INT32) {
            int32_t v;
            memcpy(&v, p, 4);
            put_int(s, i, v);
        } else if (type == PT_INT64) {
            int64_t v;
            memcpy(&v, p, 8);
            put_int(s, i, v);
        } else if (type == PT_FLOAT) {
            float v;
            memcpy(&v, p, 4);
            s->fl[i] = num_of_dbl(s->col, v);
        } else {
            double v;
            memcpy(&v, p, 8);
            s->fl[i] = num_of_dbl(s->col, v);
        }
    }
    return 0;
}

/* BYTE_STREAM_SPLIT (floats, doubles, ints): byte k of value i is at
 * k * n + i. */
static int decode_bss(const where_t *w, const sink_t *s, const unsigned char *p,
                      const unsigned char *end, int64_t n)
{
    const int type = s->col->type;
    size_t width = type == PT_INT32 || type == PT_FLOAT ? 4 : 8;
    if (type == PT_BOOLEAN || type == PT_BYTE_ARRAY || (uint64_t)(end - p) != (uint64_t)n * width)
        return bad_page(w, "BYTE_STREAM_SPLIT data of %td bytes for %lld %s values", end - p,
                        (long long)n, NAME_OF(type_names, type));
    for (int64_t i = 0; i < n; i++) {
        unsigned char b[8];
        for (size_t k = 0; k < width; k++)
            b[k] = p[k * (size_t)n + (size_t)i];
        if (type == PT_INT32 || type == PT_INT64) {
            int32_t v4;
            int64_t v8;
            memcpy(&v4, b, 4);
            memcpy(&v8, b, 8);
            put_int(s, i, type == PT_INT32 ? v4 : v8);
        } else {
            float f4;
            double f8;
            memcpy(&f4, b, 4);
            memcpy(&f8, b, 8);
            s->fl[i] = num_of_dbl(s->col, type == PT_FLOAT ? f4 : f8);
        }
    }
    return 0;
}

/* DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY. */
static int decode_delta_bytes(const where_t *w, const sink_t *s, int enc, const unsigned char *p,
                              const unsigned char *end, int64_t n)
{
    scratch_t *sc = w->sc;
    int64_t nprefix = 0, nlen = 0;
    if (s->col->type != PT_BYTE_ARRAY)
        return bad_page(w, "%s is for strings, the column is %s", NAME_OF(encoding_names, enc),
                        NAME_OF(type_names, s->col->type));
    if (enc == ENC_DELTA_BA) {
        KILN_CHECK(dbp_decode(w, &p, end, n, &sc->dbp2, &sc->dbp2_cap, &nprefix));
        if (nprefix != n)
            return bad_page(w, "DELTA_BYTE_ARRAY has %lld prefix lengths for %lld values",
                            (long long)nprefix, (long long)n);
    }
    KILN_CHECK(dbp_decode(w, &p, end, n, &sc->dbp, &sc->dbp_cap, &nlen));
    if (nlen != n)
        return bad_page(w, "%s has %lld lengths for %lld values", NAME_OF(encoding_names, enc),
                        (long long)nlen, (long long)n);
    size_t prev_len = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t l = sc->dbp[i];
        if (l < 0 || l > end - p)
            return bad_page(w, "string %lld (%lld bytes) runs past the page", (long long)i,
                            (long long)l);
        if (enc == ENC_DELTA_LBA) {
            put_bytes(s, i, p, (size_t)l);
        } else {
            int64_t pre = sc->dbp2[i];
            if (pre < 0 || (size_t)pre > prev_len)
                return bad_page(w, "string %lld shares %lld bytes with a %zu-byte predecessor",
                                (long long)i, (long long)pre, prev_len);
            KILN_CHECK(grow_bytes(&sc->prev, &sc->prev_cap, (size_t)pre + (size_t)l + 1));
            memcpy(sc->prev + pre, p, (size_t)l);
            prev_len = (size_t)pre + (size_t)l;
            put_bytes(s, i, sc->prev, prev_len);
        }
        p += l;
    }
    return 0;
}

/* RLE-encoded booleans (a 4-byte length, then the hybrid with width 1). */
static int decode_rle_bool(const where_t *w, const sink_t *s, const unsigned char *p,
                           const unsigned char *end, int64_t n)
{
    uint32_t len;
    if (s->col->type != PT_BOOLEAN || end - p < 4)
        return bad_page(w, "RLE values in a %s column", NAME_OF(type_names, s->col->type));
    memcpy(&len, p, 4);
    if (len > (uint64_t)(end - p - 4))
        return bad_page(w, "RLE booleans of %u bytes run past the page", len);
    uint32_t *tmp = kiln_malloc((size_t)(n ? n : 1) * sizeof *tmp);
    if (tmp == NULL)
        return KILN_ENOMEM;
    int rc = 0;
    if (rle_decode(p + 4, p + 4 + len, 1, tmp, n) == NULL)
        rc = bad_page(w, "RLE booleans do not decode");
    for (int64_t i = 0; rc == 0 && i < n; i++)
        put_int(s, i, tmp[i]);
    free(tmp);
    return rc;
}

/* n dictionary indices (a bit width byte, then the hybrid) into ids[],
 * every one checked against the column's dictionary (one pass that keeps
 * the largest). */
static int read_dict_ids(const where_t *w, const dcol_t *d, const unsigned char *p,
                         const unsigned char *end, int64_t n, uint32_t *ids)
{
    if (d->dict_f == NULL && d->dict_k == NULL)
        return bad_page(w, "dictionary-encoded values but no dictionary page before them");
    if (p >= end && n > 0)
        return bad_page(w, "dictionary indices missing");
    if (n == 0)
        return 0;
    uint32_t top = 0;
    if (rle_decode(p + 1, end, p[0], ids, n) == NULL)
        return bad_page(w, "dictionary indices do not decode");
#pragma omp simd reduction(max : top)
    for (int64_t i = 0; i < n; i++)
        top = ids[i] > top ? ids[i] : top;
    if (top >= (uint64_t)d->ndict)
        return bad_page(w, "dictionary index %u is past the dictionary's %lld entries", top,
                        (long long)d->ndict);
    return 0;
}

/* Dictionary indices looked up in the column's converted dictionary. */
static int decode_dict_ids(const where_t *w, const sink_t *s, const dcol_t *d,
                           const unsigned char *p, const unsigned char *end, int64_t n)
{
    KILN_CHECK(grow(&w->sc->ids, &w->sc->ids_cap, n + 1, sizeof(uint32_t)));
    uint32_t *ids = w->sc->ids;
    KILN_CHECK(read_dict_ids(w, d, p, end, n, ids));
    if (s->col->role == ROLE_CAT)
        for (int64_t i = 0; i < n; i++)
            s->k[i] = d->dict_k[ids[i]];
    else
        for (int64_t i = 0; i < n; i++)
            s->fl[i] = d->dict_f[ids[i]];
    return 0;
}

static int decode_values(const where_t *w, const sink_t *s, const dcol_t *d, int enc,
                         const unsigned char *p, const unsigned char *end, int64_t n)
{
    switch (enc) {
    case ENC_PLAIN:
        return decode_plain(w, s, p, end, n);
    case ENC_PLAIN_DICT:
    case ENC_RLE_DICT:
        return decode_dict_ids(w, s, d, p, end, n);
    case ENC_RLE:
        return decode_rle_bool(w, s, p, end, n);
    case ENC_DELTA_BP: {
        int64_t got = 0;
        if (s->col->type != PT_INT32 && s->col->type != PT_INT64)
            return bad_page(w, "DELTA_BINARY_PACKED in a %s column",
                            NAME_OF(type_names, s->col->type));
        KILN_CHECK(dbp_decode(w, &p, end, n, &w->sc->dbp, &w->sc->dbp_cap, &got));
        if (got != n)
            return bad_page(w, "DELTA_BINARY_PACKED holds %lld values, the page %lld",
                            (long long)got, (long long)n);
        for (int64_t i = 0; i < n; i++)
            put_int(s, i, s->col->type == PT_INT32 ? (int32_t)w->sc->dbp[i] : w->sc->dbp[i]);
        return 0;
    }
    case ENC_DELTA_LBA:
    case ENC_DELTA_BA:
        return decode_delta_bytes(w, s, enc, p, end, n);
    case ENC_BSS:
        return decode_bss(w, s, p, end, n);
    default:
        return unsupported(w, "encoding", NAME_OF(encoding_names, enc), enc);
    }
}

/* Room for n values in the page scratch. */
static int reserve_values(scratch_t *sc, int64_t n)
{
    KILN_CHECK(grow(&sc->vk, &sc->vk_cap, n + 1, sizeof(int64_t)));
    return grow(&sc->vf, &sc->vf_cap, n + 1, sizeof(float));
}

/* A categorical column held as dictionary indices turns into keys: before
 * its dictionary changes, or when a page that is not dictionary-encoded
 * follows (a writer's dictionary grew too big). */
static int keys_from_ids(dcol_t *d)
{
    if (!d->by_id)
        return 0;
    KILN_CHECK(grow(&d->keys, &d->kcap, d->nkeys + 1, sizeof(int64_t)));
    for (int64_t i = 0; i < d->nkeys; i++)
        d->keys[i] = d->dict_k[d->ids[i]];
    d->by_id = false;
    return 0;
}

/* A dictionary page: PLAIN values, converted once. */
static int read_dict(const where_t *w, dcol_t *d, const unsigned char *p, const unsigned char *end,
                     int64_t n, int enc)
{
    if (enc != ENC_PLAIN && enc != ENC_PLAIN_DICT)
        return unsupported(w, "dictionary encoding", NAME_OF(encoding_names, enc), enc);
    if (n < 0 || n > end - p + 1)
        return bad_page(w, "a dictionary of %lld entries in %td bytes", (long long)n, end - p);
    KILN_CHECK(keys_from_ids(d));
    KILN_FREE_ALL(d->dict_f, d->dict_k);
    d->dict_f = NULL;
    d->dict_k = NULL;
    d->ndict = 0;
    bool cat = w->col->role == ROLE_CAT;
    if (cat)
        d->dict_k = kiln_calloc((size_t)n + 1, sizeof *d->dict_k);
    else
        d->dict_f = kiln_calloc((size_t)n + 1, sizeof *d->dict_f);
    if (d->dict_k == NULL && d->dict_f == NULL)
        return KILN_ENOMEM;
    sink_t s = {.col = w->col, .k = d->dict_k, .fl = d->dict_f};
    KILN_CHECK(decode_plain(w, &s, p, end, n));
    d->ndict = n;
    return 0;
}

/* The levels of a page: n entries of out[] (rep[] or def[]), and in *ntop
 * how many equal max (for def[], the values the page holds). A column
 * without such levels (max 0) has none in the page: out[] is left as it is
 * and every entry counts. v1 levels carry a 4-byte length; v2 give it in
 * the header. ntop may be NULL. */
static int read_levels(const where_t *w, const unsigned char **pp, const unsigned char *end,
                       int max, uint32_t *out, int64_t n, int64_t v2_len, int enc, int64_t *ntop)
{
    const unsigned char *p = *pp;
    if (ntop != NULL)
        *ntop = n;
    if (max == 0)
        return 0;
    uint64_t len;
    if (v2_len >= 0) {
        len = (uint64_t)v2_len;
    } else {
        uint32_t l4;
        if (enc != ENC_RLE)
            return unsupported(w, "level encoding", NAME_OF(encoding_names, enc), enc);
        if (end - p < 4)
            return bad_page(w, "the levels' length runs past the page");
        memcpy(&l4, p, 4);
        p += 4;
        len = l4;
    }
    if (len > (uint64_t)(end - p))
        return bad_page(w, "levels of %llu bytes run past the page", (unsigned long long)len);
    if (rle_decode(p, p + len, bit_width(max), out, n) == NULL)
        return bad_page(w, "the levels do not decode");
    uint32_t over = 0, top = 0; /* n <= PQ_MAX_PAGE_VALUES */
#pragma omp simd reduction(| : over) reduction(+ : top)
    for (int64_t i = 0; i < n; i++) {
        over |= out[i] > (uint32_t)max;
        top += out[i] == (uint32_t)max;
    }
    if (over) {
        int64_t i = 0;
        while (out[i] <= (uint32_t)max)
            i++;
        return bad_page(w, "level %u is past the column's maximum %d", out[i], max);
    }
    if (ntop != NULL)
        *ntop = top;
    *pp = p + len;
    return 0;
}

/* A page of a flat column (no lists) whose values can go straight into the
 * column, with no pass through the scratch values and place_rows: a page
 * with a value in every row (what Criteo-shaped files hold), or a
 * categorical page with nulls, whose nvals keys follow each other in the
 * column as in the page, a row holding one key or (null) none. */
static int decode_flat(const where_t *w, dcol_t *d, int enc, const unsigned char *p,
                       const unsigned char *end, int64_t n, int64_t nvals)
{
    const col_t *c = w->col;
    sink_t s = {.col = c};
    const bool dict = enc == ENC_PLAIN_DICT || enc == ENC_RLE_DICT;
    if (c->role == ROLE_CAT && dict && d->dict_k != NULL && (d->by_id || d->nkeys == 0)) {
        KILN_CHECK(grow(&d->ids, &d->icap, d->nkeys + nvals + 1, sizeof(uint32_t)));
        KILN_CHECK(read_dict_ids(w, d, p, end, nvals, d->ids + d->nkeys));
        d->by_id = true;
    } else {
        if (c->role == ROLE_CAT) {
            KILN_CHECK(keys_from_ids(d));
            KILN_CHECK(grow(&d->keys, &d->kcap, d->nkeys + nvals + 1, sizeof(int64_t)));
            s.k = d->keys + d->nkeys;
        } else {
            s.fl = d->f + d->rows;
        }
        KILN_CHECK(decode_values(w, &s, d, enc, p, end, nvals));
    }
    if (c->role == ROLE_CAT) {
        const uint32_t top = (uint32_t)c->max_def, *def = w->sc->def;
        uint32_t *cnt = d->cnt + d->rows;
        if (nvals == n) {
#pragma omp simd
            for (int64_t e = 0; e < n; e++)
                cnt[e] = 1;
        } else {
#pragma omp simd
            for (int64_t e = 0; e < n; e++)
                cnt[e] = def[e] == top;
        }
        d->nkeys += nvals;
    }
    d->rows += n;
    return 0;
}

/* out[e] = the next of vals where def[e] == top, else null: a nullable
 * dense page's values spread over its rows. The scalar loop's index carries
 * from row to row (two cycles a row); AVX-512's expand places 16 rows in
 * one instruction, reading only the values the mask selects. */
static void expand_scalar(float *out, const float *vals, const uint32_t *def, uint32_t top,
                          float null, int64_t n)
{
    int64_t vi = 0;
    for (int64_t e = 0; e < n; e++) {
        const bool has = def[e] == top;
        out[e] = has ? vals[vi] : null;
        vi += has;
    }
}

#ifdef PQ_EXPAND_AVX512
__attribute__((target("avx512f"))) static void expand_avx512(float *out, const float *vals,
                                                             const uint32_t *def, uint32_t top,
                                                             float null, int64_t n)
{
    const __m512i t = _mm512_set1_epi32((int)top);
    const __m512 z = _mm512_set1_ps(null);
    int64_t e = 0, vi = 0;
    for (; e + 16 <= n; e += 16) {
        const __mmask16 k = _mm512_cmpeq_epi32_mask(_mm512_loadu_si512(def + e), t);
        _mm512_storeu_ps(out + e, _mm512_mask_expandloadu_ps(z, k, vals + vi));
        vi += __builtin_popcount(k);
    }
    expand_scalar(out + e, vals + vi, def + e, top, null, n - e);
}
#endif

static bool pq_no_simd; /* data_pq_no_simd: the tests run the scalar loop too */

void data_pq_no_simd(bool off)
{
    pq_no_simd = off;
}

static void expand_values(float *out, const float *vals, const uint32_t *def, uint32_t top,
                          float null, int64_t n)
{
#ifdef PQ_EXPAND_AVX512
    if (!pq_no_simd && __builtin_cpu_supports("avx512f")) {
        expand_avx512(out, vals, def, top, null, n);
        return;
    }
#endif
    expand_scalar(out, vals, def, top, null, n);
}

/* Appends a decoded page's rows (levels + values) to the column. The value
 * arrays hold one slot past nvals, so the list loop reads ahead without a
 * branch and keeps what the level says. */
static int place_rows(const where_t *w, dcol_t *d, int64_t n, int64_t nvals, int64_t rg_rows)
{
    scratch_t *sc = w->sc;
    const col_t *c = w->col;
    const uint32_t top = (uint32_t)c->max_def;
    if (c->role != ROLE_CAT) {
        expand_values(d->f + d->rows, sc->vf, sc->def, top, c->role == ROLE_LABEL ? NAN : 0.0f, n);
        d->rows += n;
        return 0;
    }
    int64_t vi = 0;
    /* A list column (flat categorical ones went through decode_flat). */
    KILN_CHECK(grow(&d->keys, &d->kcap, d->nkeys + nvals + 1, sizeof(int64_t)));
    for (int64_t e = 0; e < n; e++) {
        if (sc->rep[e] == 0) {
            if (d->rows >= rg_rows)
                return bad_page(w, "the pages hold more rows than the row group's %lld",
                                (long long)rg_rows);
            d->cnt[d->rows++] = 0;
        } else if (d->rows == 0) {
            return bad_page(w, "the first level entry continues a row that never started");
        } else if (d->cnt[d->rows - 1] == UINT32_MAX) {
            return bad_page(w, "a list of more than %u values in one row", UINT32_MAX);
        }
        if (sc->def[e] == top) {
            d->keys[d->nkeys++] = sc->vk[vi++];
            d->cnt[d->rows - 1]++;
        }
    }
    return 0;
}

/* The page header's fields Kiln reads. */
typedef struct {
    int64_t type, usize, csize;
    int64_t num_values, encoding, def_enc, rep_enc; /* v1 and dictionary */
    int64_t num_nulls, num_rows, def_len, rep_len;  /* v2 */
    bool compressed;                                /* v2 */
    bool has_data, has_dict, has_v2;
} page_hdr_t;

/* The header structs' integer fields, by id: a table per struct, walked by
 * one function. */
typedef struct {
    int16_t id;
    size_t off; /* of the int64_t in page_hdr_t */
    int64_t hi;
} int_field_t;

#define HDR_INT(id_, m, hi_) {id_, offsetof(page_hdr_t, m), hi_}
static const int_field_t data_ints[] = {HDR_INT(1, num_values, INT32_MAX),
                                        HDR_INT(2, encoding, INT32_MAX),
                                        HDR_INT(3, def_enc, INT32_MAX),
                                        HDR_INT(4, rep_enc, INT32_MAX), {0, 0, 0}};
/* DictionaryPageHeader: is_sorted (3) is skipped. */
static const int_field_t dict_ints[] = {HDR_INT(1, num_values, INT32_MAX),
                                        HDR_INT(2, encoding, INT32_MAX), {0, 0, 0}};
static const int_field_t v2_ints[] = {
    HDR_INT(1, num_values, INT32_MAX), HDR_INT(2, num_nulls, INT32_MAX),
    HDR_INT(3, num_rows, INT32_MAX),   HDR_INT(4, encoding, INT32_MAX),
    HDR_INT(5, def_len, INT32_MAX),    HDR_INT(6, rep_len, INT32_MAX), {0, 0, 0}};
static const int_field_t page_ints[] = {HDR_INT(1, type, INT32_MAX), HDR_INT(2, usize, PQ_MAX_PAGE),
                                        HDR_INT(3, csize, PQ_MAX_PAGE), {0, 0, 0}};

/* Reads field id into h when the table has it (*done), else leaves it. */
static bool hdr_int(tc_t *t, const int_field_t *tab, int16_t id, int type, page_hdr_t *h,
                    bool *done)
{
    for (*done = false; tab->id != 0; tab++)
        if (tab->id == id) {
            *done = true;
            return read_int(t, type, 0, tab->hi, (int64_t *)((char *)h + tab->off));
        }
    return true;
}

/* A header struct: the integers of its table, then `rest` (NULL: skip) for
 * its other fields. */
typedef struct {
    const int_field_t *tab;
    page_hdr_t *h;
    bool (*rest)(tc_t *t, int16_t id, int type, page_hdr_t *h);
} hdr_walk_t;

static bool hdr_field(tc_t *t, int16_t id, int type, void *arg)
{
    hdr_walk_t *w = arg;
    bool done;
    if (!hdr_int(t, w->tab, id, type, w->h, &done))
        return false;
    if (done)
        return true;
    return w->rest != NULL ? w->rest(t, id, type, w->h) : tc_skip(t, type);
}

/* DataPageHeaderV2 beside its integers: is_compressed (7). */
static bool v2_rest(tc_t *t, int16_t id, int type, page_hdr_t *h)
{
    if (id == 7 && (type == TT_TRUE || type == TT_FALSE)) {
        h->compressed = type == TT_TRUE;
        return true;
    }
    return id != 7 && tc_skip(t, type);
}

/* PageHeader beside its integers: the data (5), dictionary (7) or v2 (8)
 * header, each a struct of integers (DataPageHeader, DictionaryPageHeader). */
static bool ph_rest(tc_t *t, int16_t id, int type, page_hdr_t *h)
{
    if (type != TT_STRUCT || (id != 5 && id != 7 && id != 8))
        return tc_skip(t, type);
    hdr_walk_t w = {.tab = id == 5 ? data_ints : id == 7 ? dict_ints : v2_ints, .h = h};
    if (id == 8)
        w.rest = v2_rest;
    h->has_data |= id == 5;
    h->has_dict |= id == 7;
    h->has_v2 |= id == 8;
    return tc_struct(t, hdr_field, &w);
}

/* Decodes one data page (v1 or v2) whose bytes are [p, p + h->csize). */
static int read_data_page(const where_t *w, dcol_t *d, const chunk_t *ch, const page_hdr_t *h,
                          const unsigned char *p, int64_t rg_rows)
{
    scratch_t *sc = w->sc;
    const col_t *c = w->col;
    const int64_t n = h->num_values;
    const unsigned char *body, *end;
    int64_t nvals; /* the values the page holds: its def levels that equal max_def */
    KILN_CHECK(grow(&sc->rep, &sc->rep_cap, n + 1, sizeof(uint32_t)));
    KILN_CHECK(grow(&sc->def, &sc->def_cap, n + 1, sizeof(uint32_t)));
    if (h->type == PAGE_DATA_V2) {
        if (h->rep_len + h->def_len > h->csize || h->rep_len + h->def_len > h->usize)
            return bad_page(w, "levels of %lld bytes in a page of %lld",
                            (long long)(h->rep_len + h->def_len), (long long)h->csize);
        const unsigned char *lv = p;
        KILN_CHECK(read_levels(w, &lv, p + h->rep_len, c->max_rep, sc->rep, n, h->rep_len, 0,
                               NULL));
        lv = p + h->rep_len;
        KILN_CHECK(read_levels(w, &lv, lv + h->def_len, c->max_def, sc->def, n, h->def_len, 0,
                               &nvals));
        const unsigned char *vals = p + h->rep_len + h->def_len;
        size_t clen = (size_t)(h->csize - h->rep_len - h->def_len);
        size_t ulen = (size_t)(h->usize - h->rep_len - h->def_len);
        KILN_CHECK(decompress(w, h->compressed ? ch->codec : CODEC_NONE, vals, clen, ulen, &body));
        end = body + ulen;
    } else {
        KILN_CHECK(decompress(w, ch->codec, p, (size_t)h->csize, (size_t)h->usize, &body));
        end = body + h->usize;
        KILN_CHECK(read_levels(w, &body, end, c->max_rep, sc->rep, n, -1, (int)h->rep_enc,
                               NULL));
        KILN_CHECK(read_levels(w, &body, end, c->max_def, sc->def, n, -1, (int)h->def_enc,
                               &nvals));
    }
    if (c->max_def == 0 && c->max_rep > 0) /* a list whose every level entry holds a value */
        memset(sc->def, 0, (size_t)n * sizeof *sc->def);
    if (c->max_rep == 0 && d->rows + n > rg_rows) /* a flat column: a level entry a row */
        return bad_page(w, "the pages hold more rows than the row group's %lld",
                        (long long)rg_rows);
    if (c->max_rep == 0 && (nvals == n || c->role == ROLE_CAT)) /* into the column as decoded */
        return decode_flat(w, d, (int)h->encoding, body, end, n, nvals);
    KILN_CHECK(reserve_values(sc, nvals));
    sink_t s = {.col = c, .k = sc->vk, .fl = sc->vf};
    KILN_CHECK(decode_values(w, &s, d, (int)h->encoding, body, end, nvals));
    sc->vk[nvals] = 0; /* the slot place_rows reads ahead */
    sc->vf[nvals] = 0.0f;
    return place_rows(w, d, n, nvals, rg_rows);
}

/* Decodes column c of row group g into f->dc[c]. */
static int decode_chunk(data_pq_file_t *f, int g, int c, scratch_t *sc, int64_t *bytes)
{
    const chunk_t *ch = &f->chunks[(size_t)g * (size_t)f->ncols + (size_t)c];
    const int64_t rg_rows = f->rg_start[g + 1] - f->rg_start[g];
    dcol_t *d = &f->dc[c];
    where_t w = {.f = f, .sc = sc, .col = &f->cols[c], .rg = g, .at = ch->start};
    d->rows = 0;
    d->nkeys = 0;
    d->by_id = false;
    d->at_row = 0;
    d->at_key = 0;
    d->ndict = 0;
    KILN_FREE_ALL(d->dict_f, d->dict_k);
    d->dict_f = NULL;
    d->dict_k = NULL;
    if (rg_rows == 0)
        return 0;
    if (ch->codec != CODEC_NONE && ch->codec != CODEC_SNAPPY && ch->codec != CODEC_GZIP &&
        ch->codec != CODEC_ZSTD)
        return unsupported(&w, "codec", NAME_OF(codec_names, ch->codec), ch->codec);
    KILN_CHECK(grow_bytes(&sc->chunk_buf, &sc->chunk_cap, (size_t)ch->size));
    KILN_CHECK(pread_full(f, sc->chunk_buf, (size_t)ch->size, ch->start));
    *bytes += ch->size;
    const unsigned char *p = sc->chunk_buf, *end = sc->chunk_buf + ch->size;
    int64_t seen = 0;
    while (seen < ch->num_values) {
        page_hdr_t h = {.compressed = true};
        hdr_walk_t hw = {.tab = page_ints, .h = &h, .rest = ph_rest};
        tc_t t = {.p = p, .end = end};
        w.at = ch->start + (p - sc->chunk_buf);
        if (p >= end)
            return bad_page(&w, "the chunk ends after %lld of its %lld values", (long long)seen,
                            (long long)ch->num_values);
        if (!tc_struct(&t, hdr_field, &hw))
            return bad_page(&w, "the page header does not decode");
        p = t.p;
        if (h.csize > end - p)
            return bad_page(&w, "a page of %lld bytes runs past its column chunk",
                            (long long)h.csize);
        if (h.type == PAGE_DICT && h.has_dict) {
            const unsigned char *body;
            KILN_CHECK(decompress(&w, ch->codec, p, (size_t)h.csize, (size_t)h.usize, &body));
            KILN_CHECK(read_dict(&w, d, body, body + h.usize, h.num_values, (int)h.encoding));
        } else if ((h.type == PAGE_DATA && h.has_data) || (h.type == PAGE_DATA_V2 && h.has_v2)) {
            if (h.num_values > ch->num_values - seen || h.num_values > PQ_MAX_PAGE_VALUES)
                return bad_page(&w, "a page of %lld values in a chunk of %lld (%lld read)",
                                (long long)h.num_values, (long long)ch->num_values,
                                (long long)seen);
            KILN_CHECK(read_data_page(&w, d, ch, &h, p, rg_rows));
            seen += h.num_values;
        } else if (h.type == PAGE_DATA || h.type == PAGE_DATA_V2 || h.type == PAGE_DICT) {
            return bad_page(&w, "a page of type %lld without its header", (long long)h.type);
        } /* index pages and page types from later versions are skipped */
        p += h.csize;
    }
    if (d->rows != rg_rows)
        return bad_page(&w, "the pages hold %lld rows, the row group %lld", (long long)d->rows,
                        (long long)rg_rows);
    return 0;
}

/* Decodes every mapped column of row group g (the one kept decoded). */
static int decode_row_group(data_pq_file_t *f, int g, int64_t *bytes)
{
    int64_t rows = f->rg_start[g + 1] - f->rg_start[g];
    f->cur_rg = -1;
    if (rows + 1 > f->dc_rows_cap) {
        for (int c = 0; c < f->ncols; c++) {
            dcol_t *d = &f->dc[c];
            free(d->f);
            free(d->cnt);
            d->f = NULL;
            d->cnt = NULL;
            if (f->cols[c].role == ROLE_CAT)
                d->cnt = kiln_calloc((size_t)rows + 1, sizeof *d->cnt);
            else
                d->f = kiln_calloc((size_t)rows + 1, sizeof *d->f);
            if (d->f == NULL && d->cnt == NULL)
                return KILN_ENOMEM;
        }
        f->dc_rows_cap = rows + 1;
    }
    /* The columns are independent: on the team, a column per thread, each
     * with its own buffers and decoder contexts. Every column is decoded
     * even after one fails, so that the error reported is always the first
     * column's that failed, whichever thread met it first. */
    const int nt = f->team ? omp_get_max_threads() : 1;
    if (nt > f->nsc) {
        scratch_t *sc = kiln_reallocarray(f->sc, (size_t)nt, sizeof *sc);
        if (sc == NULL)
            return KILN_ENOMEM;
        memset(sc + f->nsc, 0, (size_t)(nt - f->nsc) * sizeof *sc);
        f->sc = sc;
        f->nsc = nt;
    }
    int bad = f->ncols, bad_rc = 0;
    char bad_msg[DATA_MESSAGE_LEN] = "";
    int64_t got = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1) reduction(+ : got)
    for (int c = 0; c < f->ncols; c++) {
        int64_t cb = 0;
        int rc = decode_chunk(f, g, c, &f->sc[omp_get_thread_num()], &cb);
        got += cb;
        if (rc < 0) {
#pragma omp critical(pq_decode_err)
            if (c < bad) {
                bad = c;
                bad_rc = rc;
                snprintf(bad_msg, sizeof bad_msg, "%s", kiln_errmsg());
            }
        }
    }
    *bytes += got;
    if (bad < f->ncols)
        return kiln_errf(bad_rc, "%s", bad_msg);
    f->cur_rg = g;
    return 0;
}

/* Appends rows [r0, r1) of the decoded row group, all with a good label.
 * The dense values go in row-major, a block of rows per thread (threads
 * writing neighbouring columns of one row would share its cache line); the
 * keys a slot per thread, each slot's keys one run of its column's keys.
 * On the team when bb->team, else on this thread. */
static int append_rows(const data_pq_file_t *f, int64_t r0, int64_t r1, data_batch_builder_t *bb,
                       data_batch_t *b)
{
    const int D = bb->ndense, S = bb->nslots, i0 = bb->n;
    const int64_t n = r1 - r0;
    int rc = 0;
    memcpy(b->labels + i0, f->dc[0].f + r0, (size_t)n * sizeof(float));
#pragma omp parallel if (bb->team) reduction(min : rc)
    {
#pragma omp for schedule(static) nowait
        for (int64_t r = 0; r < n; r++) {
            float *dst = b->dense + (size_t)(i0 + r) * (size_t)D;
            for (int c = 0; c < D; c++)
                dst[c] = f->dc[1 + c].f[r0 + r];
        }
#pragma omp for schedule(dynamic, 1)
        for (int s = 0; s < S; s++) {
            dcol_t *d = &f->dc[1 + D + s];
            const uint32_t *dc = d->cnt;
            int64_t a = 0, cnt = 0, from = 0;
            if (d->at_row <= r0) { /* runs come in order: count on from the last */
                a = d->at_key;
                from = d->at_row;
            }
#pragma omp simd reduction(+ : a)
            for (int64_t r = from; r < r0; r++)
                a += dc[r];
            uint32_t *counts = bb->counts + (size_t)s * (size_t)bb->cap_rows + (size_t)i0;
#pragma omp simd reduction(+ : cnt)
            for (int64_t r = 0; r < n; r++) {
                counts[r] = dc[r0 + r];
                cnt += dc[r0 + r];
            }
            d->at_row = r1;
            d->at_key = a + cnt;
            int src = data_builder_reserve(bb, s, cnt);
            if (src < 0) {
                rc = src;
                continue;
            }
            int64_t *dst = bb->slot_keys[s] + bb->slot_len[s];
            if (d->by_id) {
                const uint32_t *ids = d->ids + a;
                const int64_t *dict = d->dict_k;
                for (int64_t j = 0; j < cnt; j++)
                    dst[j] = dict[ids[j]];
            } else {
                memcpy(dst, d->keys + a, (size_t)cnt * sizeof(int64_t));
            }
            bb->slot_len[s] += cnt;
        }
    }
    if (rc < 0)
        return KILN_ENOMEM;
    bb->n += (int)n;
    return 0;
}

int data_pq_read_rows(data_pq_file_t *f, int64_t lo, int64_t hi, data_batch_builder_t *bb,
                    data_batch_t *b, data_reader_stats_t *st, int64_t *bytes)
{
    int g = 0;
    while (lo < hi) {
        while (g < f->nrg && f->rg_start[g + 1] <= lo)
            g++;
        if (g >= f->nrg)
            return kiln_errf(KILN_ECORRUPT, "Parquet file %s holds %lld rows, row %lld was asked "
                             "for; did it change while being read?", f->path,
                             (long long)f->nrows, (long long)lo);
        if (f->cur_rg != g)
            KILN_CHECK(decode_row_group(f, g, bytes));
        const int64_t base = f->rg_start[g];
        const int64_t e = hi < f->rg_start[g + 1] ? hi : f->rg_start[g + 1];
        /* Runs of rows with good labels go in whole; a row whose label is
         * null or not 0 / 1 is counted and left out. */
        int64_t run = lo;
        for (int64_t row = lo; row <= e; row++) {
            if (row < e && !isnan(f->dc[0].f[row - base]))
                continue;
            if (row > run)
                KILN_CHECK(append_rows(f, run - base, row - base, bb, b));
            if (row < e) {
                data_stats_malformed(st, f->path, row + 1, "the label is null or not 0 / 1");
                b->nskipped++;
            }
            run = row + 1;
        }
        lo = e;
    }
    return 0;
}

int data_parquet_complete(const char *path)
{
    int fd;
    unsigned char tail[4];
    struct stat sb;
    KILN_CHECK(data_open(path, &fd));
    int rc = fstat(fd, &sb) < 0 ? kiln_errf(KILN_EIO, "cannot stat %s: %s", path, strerror(errno))
                                : 0;
    if (rc == 0 && sb.st_size >= 12) {
        ssize_t n = pread(fd, tail, 4, (off_t)(sb.st_size - 4));
        if (n < 0)
            rc = kiln_errf(KILN_EIO, "cannot read %s: %s", path, strerror(errno));
        else
            rc = n == 4 && memcmp(tail, "PAR1", 4) == 0;
    }
    close(fd);
    return rc;
}
