"""RapidFire AI module path, mapped onto rapidfire_nb (see rapidfire_nb.compat)."""
