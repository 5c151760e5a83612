"""Copy measurements from one gemmgen results file (SQLite) into another, keeping the target's
schema: results/h100.db stays a schema-2 file (tests/store/test_db_migration.py migrates a copy of it),
while a run on the GPU records into a copy that gemmgen migrated to the current schema.

Each measurement of SRC (created at or after --since, with the tag --tag if given) is inserted
into DST with its device, kernel and problem matched by their unique keys (device name and
architecture; kernel name, architecture and source hash; M, N, K, alpha, beta), created where DST
lacks them; the columns DST's schema has are copied, the rest dropped. Only one-product rows
are copied into a target without batch counts (schema < 4). A measurement already in DST (same
kernel, device, problem and time) is skipped, so running it twice adds nothing. DST is left in
rollback-journal mode, readable from read-only media.
usage: python benchmarks/merge_results.py SRC.db DST.db [--since ISO] [--tag TAG] [--dry-run]"""
import argparse
import sqlite3


def columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]


def get_or_insert(dst, table: str, key: dict, row: dict) -> int:
    where = " AND ".join(f"{k} IS ?" for k in key)
    found = dst.execute(f"SELECT id FROM {table} WHERE {where}", tuple(key.values())).fetchone()
    if found:
        return found[0]
    keep = {k: v for k, v in row.items() if k in columns(dst, table) and k != "id"}
    cur = dst.execute(f"INSERT INTO {table} ({', '.join(keep)}) VALUES ({', '.join('?' * len(keep))})",
                      tuple(keep.values()))
    return cur.lastrowid


def merge(src_path: str, dst_path: str, since: str | None, tag: str | None, dry_run: bool) -> int:
    src, dst = sqlite3.connect(src_path), sqlite3.connect(dst_path)
    src.row_factory = sqlite3.Row
    batched_target = "batch_count" in columns(dst, "measurements")
    query, args = "SELECT * FROM measurements WHERE 1", []
    if since:
        query, args = query + " AND created_at >= ?", args + [since]
    if tag:
        query, args = query + " AND tag = ?", args + [tag]
    added = skipped = 0
    for m in src.execute(query, args).fetchall():
        m = dict(m)
        if not batched_target and (m.get("batch_count") or 1) != 1:
            skipped += 1
            continue
        d = dict(src.execute("SELECT * FROM devices WHERE id = ?", (m["device_id"],)).fetchone())
        k = dict(src.execute("SELECT * FROM kernels WHERE id = ?", (m["kernel_id"],)).fetchone())
        p = dict(src.execute("SELECT * FROM problems WHERE id = ?", (m["problem_id"],)).fetchone())
        device = get_or_insert(dst, "devices", {"name": d["name"], "arch": d["arch"]}, d)
        kernel = get_or_insert(dst, "kernels", {"name": k["name"], "arch": k["arch"], "source_hash": k["source_hash"]}, k)
        problem = get_or_insert(dst, "problems", {c: p[c] for c in ("m", "n", "k", "alpha", "beta")}, p)
        same = dst.execute("SELECT 1 FROM measurements WHERE kernel_id = ? AND device_id = ? AND problem_id = ? AND "
                           "created_at = ?", (kernel, device, problem, m["created_at"])).fetchone()
        if same:
            skipped += 1
            continue
        m.update(kernel_id=kernel, device_id=device, problem_id=problem)
        keep = {c: m[c] for c in columns(dst, "measurements") if c in m and c != "id"}
        dst.execute(f"INSERT INTO measurements ({', '.join(keep)}) VALUES ({', '.join('?' * len(keep))})",
                    tuple(keep.values()))
        added += 1
    if dry_run:
        dst.rollback()
    else:
        dst.commit()
        # the shipped file is read from read-only checkouts and mounts: rollback-journal mode, whatever
        # mode a gemmgen run recording into it left (tests/store/test_shipped_results.py checks)
        dst.execute("PRAGMA journal_mode=DELETE")
    dst.close()
    print(f"{'would add' if dry_run else 'added'} {added} measurements from {src_path} to {dst_path}; "
          f"{skipped} skipped (already there, or batched rows for a target without batch counts)")
    return added


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--since", help="only measurements created at or after this time (ISO, UTC, as stored)")
    ap.add_argument("--tag", help="only measurements with this tag")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    merge(args.src, args.dst, args.since, args.tag, args.dry_run)


if __name__ == "__main__":
    main()
