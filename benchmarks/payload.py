"""Ship-mode payload per graft kind for the paper's gpt2-xl and Llama-3.2-1B (from configs).

Run from the repository root: python -m benchmarks.payload
"""

from __future__ import annotations

from graft.remote import payload_table


def main() -> None:
    print("| model | graft | donor params shipped | float32 | bfloat16 |")
    print("|---|---|---:|---:|---:|")
    for row in payload_table():
        print(
            f"| {row['model']} | `{row['graft']}` | {row['params'] / 1e6:,.1f} M "
            f"| {row['bytes_float32'] / 2**20:,.0f} MiB | {row['bytes_bfloat16'] / 2**20:,.0f} MiB |"
        )


if __name__ == "__main__":
    main()
