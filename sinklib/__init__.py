"""sinklib: the helper package of sinkbook (attention-sink diagnosis of text-capability loss)."""
import warnings as _warnings

__version__ = "0.1.0"

# transformers imports tqdm.auto, which warns inside Jupyter when ipywidgets is absent. Progress bars are
# off by default in the book (show_progress=False) and fall back to text bars otherwise, so the warning
# (which also prints the local site-packages path into the rendered pages) carries no information.
_warnings.filterwarnings("ignore", message="IProgress not found")
