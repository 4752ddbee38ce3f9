// tests/parquet/write.mjs - writes Parquet files from a Criteo TSV file (made by
// `kiln datagen`) with two writers that are not Kiln's: DuckDB (@duckdb/node-api)
// and Apache Arrow's Rust parquet crate (parquet-wasm). Kiln's tests
// (tests/test_parquet.c) train on each file and on the TSV and compare.
//
//   node tests/parquet/write.mjs IN.tsv OUTDIR [NAME...]
//
// With NAMEs, only those files are written.
// Every file holds the TSV's rows in order. Columns: label (INT32), I1..I13
// (INT64, null where the TSV field is empty), C1..C26 (strings, null where
// empty), except where a file's name says otherwise:
//   duck-*-v1/v2    DuckDB, each codec, data page v1 and v2 (v2: DELTA encodings)
//   arrow-*         parquet-wasm: dictionary on and off (and full: arrow-v2-dict-zstd
//                   goes on in PLAIN), v1 and v2, DELTA_BINARY_PACKED
//                   and DELTA_BYTE_ARRAY, small row groups
//   duck-lists      C1..C3 as LIST<VARCHAR> of one element (null / empty lists where
//                   the TSV field is empty): the same keys as the TSV
//   duck-multihot   C1 as LIST<BIGINT> of the hex ids of C1 and C2 (multi-hot)
//   arrow-v2-bss-double  a BOOLEAN label, DOUBLE integers in BYTE_STREAM_SPLIT (read with
//                   dense_transform log1p: the TSV's features)
//   arrow-brotli    BROTLI pages, a codec Kiln refuses (by name)
//   duck-types      a BOOLEAN label, DECIMAL / UINTEGER / DOUBLE dense columns, a UBIGINT id
//   duck-nvt        NVTabular's shape: C* BIGINT ids (the hex value), I* FLOAT
//                   ln(1 + max(I, 0)) (nulls kept), label INT32
//   duckdefault-*   (only when named: bench/parquet_bench.sh) DuckDB with its own
//                   defaults but the codec and page version (122,880-row groups,
//                   where the duck-* files have 2048 to give the tests several)
// It prints the names written, one per line.
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { Table, tableToIPC, vectorFromArray, Bool, Float64, Int32, Int64, Utf8 } from 'apache-arrow';
import * as pw from 'parquet-wasm';

const [tsv, out, ...only] = process.argv.slice(2);
const wanted = (name) => only.length === 0 || only.includes(name);
if (!tsv || !out) {
    console.error('usage: node write.mjs IN.tsv OUTDIR');
    process.exit(2);
}
mkdirSync(out, { recursive: true });

const I = Array.from({ length: 13 }, (_, i) => `I${i + 1}`);
const C = Array.from({ length: 26 }, (_, i) => `C${i + 1}`);
const written = [];

// ---- DuckDB ----------------------------------------------------------------
const db = await DuckDBInstance.create(':memory:');
const con = await db.connect();
const types = [`'label': 'INTEGER'`, ...I.map((c) => `'${c}': 'BIGINT'`),
    ...C.map((c) => `'${c}': 'VARCHAR'`)].join(', ');
await con.run(`CREATE TABLE t AS SELECT row_number() OVER () AS rn, * FROM read_csv('${tsv}',
    delim = '\t', header = false, quote = '', escape = '', nullstr = '',
    columns = {${types}})`);
const base = `label, ${I.join(', ')}, ${C.join(', ')}`;

async function duck(name, select, opts) {
    if (!wanted(name)) return;
    const path = join(out, `${name}.parquet`);
    await con.run(`COPY (SELECT ${select} FROM t ORDER BY rn) TO '${path}' (FORMAT parquet, ${opts})`);
    written.push(name);
}

for (const [codec, ver] of [['snappy', 'v1'], ['zstd', 'v2'], ['gzip', 'v1'],
    ['uncompressed', 'v2'], ['snappy', 'v2'], ['zstd', 'v1']]) {
    await duck(`duck-${codec}-${ver}`, base,
        `COMPRESSION ${codec}, PARQUET_VERSION ${ver}, ROW_GROUP_SIZE 2048`);
    if (only.includes(`duckdefault-${codec}-${ver}`))
        await duck(`duckdefault-${codec}-${ver}`, base, `COMPRESSION ${codec}, PARQUET_VERSION ${ver}`);
}

// C1..C3 as one-element lists; an empty TSV field is a null list, an empty
// list or a list holding a null, by row.
const lists = C.map((c, i) => i >= 3 ? c : `CASE WHEN ${c} IS NOT NULL THEN [${c}]
    WHEN rn % 3 = 0 THEN NULL WHEN rn % 3 = 1 THEN []::VARCHAR[] ELSE [NULL]::VARCHAR[] END AS ${c}`);
await duck('duck-lists', `label, ${I.join(', ')}, ${lists.join(', ')}`,
    'COMPRESSION snappy, ROW_GROUP_SIZE 2048');

const hex = (c) => `('0x' || ${c})::BIGINT`;
await duck('duck-multihot', `label, ${I.join(', ')},
    list_filter([${hex('C1')}, ${hex('C2')}], x -> x IS NOT NULL) AS C1, ${C.slice(1).join(', ')}`,
    'COMPRESSION zstd, PARQUET_VERSION v2');
// Logical types: a BOOLEAN label, a DECIMAL, unsigned integers (one past
// 2^31, which must not read as negative), a DOUBLE, an unsigned id.
await duck('duck-types', `label::BOOLEAN AS label, I1::DECIMAL(18, 3) AS I1, greatest(I2, 0)::UINTEGER AS I2,
    (I3 + 3000000000)::UINTEGER AS I3, I4::DOUBLE AS I4, ${I.slice(4).join(', ')},
    ${hex('C1')}::UBIGINT AS C1, ${C.slice(1).join(', ')}`, 'COMPRESSION snappy');
await duck('duck-nvt', `label, ${I.map((c) => `ln(1 + greatest(${c}, 0))::FLOAT AS ${c}`).join(', ')},
    ${C.map((c) => `${hex(c)} AS ${c}`).join(', ')}`, 'COMPRESSION snappy');

// ---- parquet-wasm (Arrow's Rust writer) --------------------------------------
const rows = readFileSync(tsv, 'utf8').split('\n').filter((l) => l.length > 0)
    .map((l) => l.split('\t'));
const cols = { label: vectorFromArray(rows.map((r) => Number(r[0])), new Int32()) };
I.forEach((c, i) => {
    cols[c] = vectorFromArray(rows.map((r) => (r[1 + i] === '' ? null : BigInt(r[1 + i]))),
        new Int64());
});
C.forEach((c, i) => {
    cols[c] = vectorFromArray(rows.map((r) => (r[14 + i] === '' ? null : r[14 + i])), new Utf8());
});
// writeParquet takes ownership of the wasm table: one per file.
const ipc = tableToIPC(new Table(cols), 'stream');

function arrow(name, set) {
    if (!wanted(name)) return;
    let b = new pw.WriterPropertiesBuilder().setMaxRowGroupSize(1000).setDataPageSizeLimit(4096);
    b = set(b);
    writeFileSync(join(out, `${name}.parquet`), pw.writeParquet(pw.Table.fromIPCStream(ipc), b.build()));
    written.push(name);
}
const V = pw.WriterVersion, Z = pw.Compression, E = pw.Encoding;
arrow('arrow-v1-dict-snappy', (b) => b.setWriterVersion(V.V1).setCompression(Z.SNAPPY)
    .setDictionaryEnabled(true));
arrow('arrow-v1-plain-gzip', (b) => b.setWriterVersion(V.V1).setCompression(Z.GZIP)
    .setDictionaryEnabled(false));
// A dictionary of at most 512 bytes: the wide string columns' dictionaries
// fill up in each row group and the writer goes on in PLAIN, so their chunks
// hold dictionary pages followed by plain ones.
arrow('arrow-v2-dict-zstd', (b) => b.setWriterVersion(V.V2).setCompression(Z.ZSTD)
    .setDictionaryEnabled(true).setDictionaryPageSizeLimit(512));
arrow('arrow-v2-delta-zstd', (b) => {
    b = b.setWriterVersion(V.V2).setCompression(Z.ZSTD).setDictionaryEnabled(false);
    for (const c of I) b = b.setColumnEncoding(c, E.DELTA_BINARY_PACKED);
    for (const c of C) b = b.setColumnEncoding(c, E.DELTA_BYTE_ARRAY);
    return b.setColumnEncoding('label', E.DELTA_BINARY_PACKED);
});
arrow('arrow-v1-delta-none', (b) => {
    b = b.setWriterVersion(V.V1).setCompression(Z.UNCOMPRESSED).setDictionaryEnabled(false);
    for (const c of C) b = b.setColumnEncoding(c, E.DELTA_LENGTH_BYTE_ARRAY);
    return b;
});
// The label as BOOLEAN and the integers as DOUBLE, written by the V2 writer
// with BYTE_STREAM_SPLIT for the doubles (and RLE for the booleans): read
// with dense_transform log1p, the same features as the TSV's.
{
    const alt = { ...cols };
    alt.label = vectorFromArray(rows.map((r) => r[0] === '1'), new Bool());
    I.forEach((c, i) => {
        alt[c] = vectorFromArray(rows.map((r) => (r[1 + i] === '' ? null : Number(r[1 + i]))),
            new Float64());
    });
    const altIpc = tableToIPC(new Table(alt), 'stream');
    if (wanted('arrow-v2-bss-double')) {
        let b = new pw.WriterPropertiesBuilder().setMaxRowGroupSize(1000)
            .setWriterVersion(pw.WriterVersion.V2).setCompression(pw.Compression.SNAPPY)
            .setDictionaryEnabled(false);
        for (const c of I) b = b.setColumnEncoding(c, pw.Encoding.BYTE_STREAM_SPLIT);
        writeFileSync(join(out, 'arrow-v2-bss-double.parquet'),
            pw.writeParquet(pw.Table.fromIPCStream(altIpc), b.build()));
        written.push('arrow-v2-bss-double');
    }
}
// A codec Kiln does not read (the test expects it refused by name).
arrow('arrow-brotli', (b) => b.setCompression(Z.BROTLI));
console.log(written.join('\n'));
