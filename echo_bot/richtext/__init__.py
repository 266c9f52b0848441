"""Rich text on its way out: Markdown rendered once into what a person sees (``model``),
masked there (``masking``), split by one splitter (``splitting``) and written in each
channel's wire format through its ``parts.Renderer``."""
