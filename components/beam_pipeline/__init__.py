"""Running a data step as an Apache Beam pipeline: locally on N processes or as a Dataflow job.

The steps (``preprocess``, ``serialize``) build their own Beam graphs; this package turns the
config into pipeline options, runs the pipeline (cancelling a Dataflow job when the step is
stopped), and carries data errors found by workers back to the launcher in a fixed order.
"""

from components.beam_pipeline.launch import put_result, run_pipeline, take_result
from components.beam_pipeline.options import pipeline_options
from components.beam_pipeline.problems import Problem, first_problem

__all__ = ["Problem", "first_problem", "pipeline_options", "put_result", "run_pipeline", "take_result"]
