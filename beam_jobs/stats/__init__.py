"""Conversion statistics: counts and sizes per split (`conversion`) and each feature's summary (`features`)."""
