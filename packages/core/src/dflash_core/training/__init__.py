"""The DFlash training recipe: target-aligned data, target features stored once (optional), block-diffusion
drafter training, resume."""
