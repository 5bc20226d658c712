"""Model families and checkpoint presets."""
