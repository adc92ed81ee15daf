"""FX passes: the latent-gather rewrite and the selection binding."""
