"""Language models: DeltaNet / Gated DeltaNet with SiLU or NaLa feature maps, trained by the shared engine and scored by lm-eval (work in progress)."""
