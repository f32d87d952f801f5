"""Smaller tables at serving time: per-table embedding precision (fp32 to int4) searched on
validation rows, table layouts (halved dims, QR and hashed rows) and ``salience compress``."""
