"""The check kit: backends, the checks and contract gates, run parameters, records, the artifact, the run's steps."""

import warnings

# peers import tqdm.auto, which warns in a notebook kernel without ipywidgets; text bars are what the kit wants
warnings.filterwarnings("ignore", message="IProgress not found")
