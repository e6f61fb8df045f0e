"""Writes examples/penguins.csv: 344 penguins shaped like the Palmer Archipelago data.

Not the real measurements (they are not shipped here): each row is drawn from its
species' mean and spread in the real data (Gorman, Williams & Fraser 2014; the
palmerpenguins R package), with the real species counts, islands, years, and the real
file's missing values (two birds measured not at all, nine more without a sex), so that
the README's example meets what the real file would give it. Regenerate with
`python examples/make_penguins.py`; the seed fixes every value.
"""

from __future__ import annotations

import csv
import pathlib

import numpy as np

# species: (count, islands and their shares, bill length, bill depth, flipper, body mass: mean, std)
SPECIES = {
    "Adelie": (152, {"Biscoe": 44, "Dream": 56, "Torgersen": 52}, (38.8, 2.66), (18.3, 1.22), (190, 6.5), (3701, 459)),
    "Chinstrap": (68, {"Dream": 68}, (48.8, 3.34), (18.4, 1.14), (196, 7.1), (3733, 384)),
    "Gentoo": (124, {"Biscoe": 124}, (47.5, 3.08), (15.0, 0.98), (217, 6.5), (5076, 504)),
}
COLUMNS = ["species", "island", "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g", "sex", "year"]


def rows(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for species, (count, islands, bill, depth, flipper, mass) in SPECIES.items():
        names = [name for name, n in islands.items() for _ in range(n)]
        for i in range(count):
            sex = "male" if i % 2 else "female"
            shift = 1 if sex == "male" else -1  # males are larger, by about half a spread
            out.append(
                [
                    species,
                    names[i],
                    f"{rng.normal(bill[0] + shift * 0.5 * bill[1], bill[1] * 0.8):.1f}",
                    f"{rng.normal(depth[0] + shift * 0.5 * depth[1], depth[1] * 0.8):.1f}",
                    str(int(round(rng.normal(flipper[0] + shift * 0.5 * flipper[1], flipper[1] * 0.8)))),
                    str(int(round(rng.normal(mass[0] + shift * 0.5 * mass[1], mass[1] * 0.8) / 25) * 25)),
                    sex,
                    str(2007 + i % 3),
                ]
            )
    order = rng.permutation(len(out))
    out = [out[i] for i in order]
    for i in (3, 271):  # two birds measured not at all
        out[i][2:7] = ["NA"] * 5
    for i in (8, 9, 10, 11, 47, 178, 218, 256, 268):  # nine more without a sex
        out[i][6] = "NA"
    return out


if __name__ == "__main__":
    path = pathlib.Path(__file__).resolve().parent / "penguins.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows(rows())
    print(f"wrote {path}")
