"""Transfer: VTAB-1k task adapters and protocol (Table 3), training from scratch on Sun397 (Table 7)."""
