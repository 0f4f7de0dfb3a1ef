"""Run harness: stress, bench and sweep drivers over the backends (torch imported lazily)."""
