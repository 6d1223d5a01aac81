"""Dataset converters: official release formats -> claim records (SPEC §2).

``CONVERTERS`` maps the ``--dataset`` name to a :class:`~.base.Converter`;
adding a dataset is one module plus one line here.
"""

from __future__ import annotations

from . import check_covid, climate_fever, fever, scifact
from .base import Converter, ConvertInputs, ConvertStats, InputError

CONVERTERS: dict[str, Converter] = {
    c.name: c
    for c in (check_covid.CONVERTER, scifact.CONVERTER, climate_fever.CONVERTER, fever.CONVERTER)
}

__all__ = ["CONVERTERS", "ConvertInputs", "ConvertStats", "Converter", "InputError"]
