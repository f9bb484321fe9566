"""Perseus's own problem (SOSP'24 artifact): its stage profile, Merak's 1F1B order, the DAG and energy
accounting its emulation plans on, and its schedule formats, so that EMO's planner can be run on it
and its plans handed to Perseus's client. See docs/perseus.md."""
