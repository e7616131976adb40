"""Chapter 6's negative controls: weight merging (`merge`) and QK-RMSNorm injection (`inject`)."""
