// tests/parquet/fuzz_seeds.mjs - writes the seed corpus of the Parquet fuzz
// harness (tests/fuzz/fuzz_parquet.c) into tests/fuzz/corpus/parquet/: small
// files (40 rows, under libFuzzer's 8 KiB max_len) of the columns it maps,
// label INT32, I1 BIGINT (nullable), C1 VARCHAR (nullable), C2 LIST<BIGINT>,
// from DuckDB and Arrow's Rust writer with each codec, page version and
// dictionary setting.
//   node tests/parquet/fuzz_seeds.mjs
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DuckDBInstance } from '@duckdb/node-api';
import * as pw from 'parquet-wasm';

const out = join(dirname(fileURLToPath(import.meta.url)), '../fuzz/corpus/parquet');
mkdirSync(out, { recursive: true });
const con = await (await DuckDBInstance.create(':memory:')).connect();
await con.run(`CREATE TABLE t AS SELECT (i % 2)::INTEGER AS label,
    CASE WHEN i % 5 = 0 THEN NULL ELSE i * 7 - 20 END::BIGINT AS I1,
    CASE WHEN i % 7 = 0 THEN NULL ELSE 'id' || (i % 9) END AS C1,
    CASE WHEN i % 4 = 0 THEN NULL ELSE [i, i % 3]::BIGINT[] END AS C2
    FROM range(40) r(i)`);
for (const [codec, ver] of [['snappy', 'v1'], ['zstd', 'v2'], ['gzip', 'v1'], ['uncompressed', 'v2']])
    await con.run(`COPY t TO '${join(out, `duck-${codec}-${ver}`)}'
        (FORMAT parquet, COMPRESSION ${codec}, PARQUET_VERSION ${ver})`);
// The same rows through Arrow's Rust writer: DuckDB's file read back by
// parquet-wasm and written again with the Rust writer's settings.
const duckFile = join(out, 'duck-uncompressed-v2');
const V = pw.WriterVersion, Z = pw.Compression, E = pw.Encoding;
const variants = {
    'arrow-v1-dict-snappy': (b) => b.setWriterVersion(V.V1).setCompression(Z.SNAPPY),
    'arrow-v2-plain-zstd': (b) => b.setWriterVersion(V.V2).setCompression(Z.ZSTD)
        .setDictionaryEnabled(false),
    'arrow-v2-delta': (b) => b.setWriterVersion(V.V2).setDictionaryEnabled(false)
        .setColumnEncoding('I1', E.DELTA_BINARY_PACKED).setColumnEncoding('C1', E.DELTA_BYTE_ARRAY),
    'arrow-v2-bss': (b) => b.setWriterVersion(V.V2).setDictionaryEnabled(false)
        .setColumnEncoding('I1', E.BYTE_STREAM_SPLIT),
};
for (const [name, set] of Object.entries(variants)) {
    const table = pw.readParquet(readFileSync(duckFile));
    const b = set(new pw.WriterPropertiesBuilder().setMaxRowGroupSize(16));
    writeFileSync(join(out, name), pw.writeParquet(table, b.build()));
}
