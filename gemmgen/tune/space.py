"""Search spaces: which values of each parameter the tuner explores, read from
``search_spaces/<family>.toml``. They hold no constraints: those are the family's."""

import random
import tomllib
from dataclasses import dataclass, replace

from gemmgen.describe.families import FAMILIES, get_family
from gemmgen.errors import GemmgenError
from gemmgen.paths import search_spaces_dir


@dataclass(frozen=True)
class SearchSpace:
    family: str
    precisions: tuple[str, ...]
    params: dict[str, tuple]  # parameter -> values to explore, each allowed by the family
    # [[fit]] tables: tile shapes whose BM `tune --workload` fits to each token count (gemmgen.tune.fill);
    # each gives some of the family's parameters, BM left to the fit
    fits: tuple[dict, ...] = ()

    def sample(self, rng: random.Random) -> dict:
        """One point drawn uniformly from the space (it may still break a constraint)."""
        return {name: rng.choice(values) for name, values in self.params.items()}

    def precision(self, asked: str | None) -> str:
        """The precision to tune: ``asked``, or the space's first. Raises GemmgenError where the
        space does not take it."""
        precision = asked or self.precisions[0]
        if precision not in self.precisions:
            raise GemmgenError(f"the {self.family} search space does not take precision {precision!r}; "
                               f"it takes: {', '.join(self.precisions)}")
        return precision

    def narrowed(self, precision: str, variant) -> "SearchSpace":
        """This space with each parameter's values cut to those the family allows in ``precision``
        and ``variant`` (Family.allowed), where that leaves any; else as it is (the family's
        check then says why no point fits)."""
        allowed = get_family(self.family).allowed(precision, variant)
        params = {name: tuple(v for v in values if v in allowed.get(name, values)) or values
                  for name, values in self.params.items()}
        return replace(self, params=params)

    @property
    def size(self) -> int:
        n = 1
        for values in self.params.values():
            n *= len(values)
        return n


def load_space(family: str) -> SearchSpace:
    """Read and check ``search_spaces/<family>.toml``.

    Raises GemmgenError naming the file and the problem: a missing file, a parameter the family
    does not have, a value the family does not allow, or a parameter left out.
    """
    fam = get_family(family)
    path = search_spaces_dir() / f"{fam.name}.toml"
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise GemmgenError(f"no search space for family {fam.name!r}: {path} is missing") from None
    except tomllib.TOMLDecodeError as err:
        raise GemmgenError(f"{path}: not valid TOML: {err}") from None
    raw = data.get("params")
    if not isinstance(raw, dict):
        raise GemmgenError(f"{path}: needs a [params] table listing each parameter's values")
    if data.get("family", fam.name) != fam.name:
        raise GemmgenError(f"{path}: says family = {data['family']!r}, but the file is {fam.name!r}'s")
    params = {}
    for name, values in raw.items():
        try:
            p = fam.param(name)
            if not isinstance(values, list) or not values:
                raise GemmgenError(f"{name} must be a non-empty list of values")
            kind = type(p.choices[0])
            wrong = [v for v in values if type(v) is not kind]
            if wrong:
                raise GemmgenError(f"{name}: {wrong} are not {kind.__name__} values")
            params[p.name] = tuple(dict.fromkeys(p.parse(v) for v in values))  # in order, without repeats
        except GemmgenError as err:
            raise GemmgenError(f"{path}: {err}") from None
    missing = [p.name for p in fam.params if p.name not in params]
    if missing:
        raise GemmgenError(f"{path}: parameters missing from [params]: {', '.join(missing)}")
    precisions = data.get("precisions", list(fam.precisions))
    if not isinstance(precisions, list) or not precisions:
        raise GemmgenError(f"{path}: precisions must be a non-empty list, e.g. {list(fam.precisions)}")
    precisions = tuple(precisions)
    bad = [p for p in precisions if p not in fam.precisions]
    if bad:
        raise GemmgenError(f"{path}: precisions {bad} not taken by family {fam.name!r} ({', '.join(fam.precisions)})")
    fits = []
    for i, raw_fit in enumerate(data.get("fit", [])):
        try:
            if not isinstance(raw_fit, dict) or "BM" in raw_fit:
                raise GemmgenError("each [[fit]] gives parameters other than BM (the fit chooses BM)")
            fits.append({fam.param(name).name: fam.param(name).parse(value) for name, value in raw_fit.items()})
        except GemmgenError as err:
            raise GemmgenError(f"{path}: [[fit]] {i + 1}: {err}") from None
    return SearchSpace(fam.name, precisions, {p.name: params[p.name] for p in fam.params}, tuple(fits))


def all_spaces() -> dict[str, SearchSpace]:
    return {name: load_space(name) for name in FAMILIES}
