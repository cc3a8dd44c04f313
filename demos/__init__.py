"""Short scripts that call ``unimodal`` only, each writing files a person can open."""
