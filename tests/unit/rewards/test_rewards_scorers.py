"""Rule scorers: GSM8K final numbers (strict / flexible), boxed MATH answers (math-verify and the string
fallback), format checks and the synthetic tasks' exact match."""

import logging

import pytest

from verl_like.rewards import format as fmt
from verl_like.rewards import gsm8k, math, synthetic


@pytest.mark.parametrize("text, strict, flexible", [
    ("so 3 + 4 = 7\n#### 7", "7", "7"),
    ("#### 1,234.", "1234", "1234"),
    ("#### $56", "56", "56"),
    ("#### -12.5 dollars", "-12.5", "-12.5"),
    ("#### 1\n#### 2", "2", "2"),
    ("the answer is 42", None, "42"),
    ("answer: 3.0 then 17 apples.", None, "17"),
    ("no numbers here", None, None),
    ("####", None, None),
])
def test_gsm8k_extraction(text, strict, flexible):
    assert gsm8k.extract_solution(text, "strict") == strict
    assert gsm8k.extract_solution(text, "flexible") == flexible


def test_gsm8k_scores():
    assert gsm8k.compute_score("#### 1,000", "1000") == 1.0
    assert gsm8k.compute_score("#### 72.00", "72") == 1.0
    assert gsm8k.compute_score("#### 71", "72") == 0.0
    assert gsm8k.compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("it is 72", "72") == 0.0  # strict needs the marker
    assert gsm8k.compute_score("it is 72", "72", method="flexible") == 1.0
    assert gsm8k.compute_score("#### 5", 5, score=2.0) == 2.0
    with pytest.raises(ValueError, match="method='loose'"):
        gsm8k.extract_solution("1", "loose")


def test_numbers_equal_falls_back_to_text():
    assert gsm8k.numbers_equal("1e3", "1000")
    assert gsm8k.numbers_equal("abc", "abc") and not gsm8k.numbers_equal("abc", "abd")


@pytest.mark.parametrize("text, content", [
    (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
    (r"\boxed{1} then \boxed{{a}+b}", "{a}+b"),
    (r"\fbox{7}", "7"),
    (r"final: \boxed 42.", "42"),
    (r"\boxed{unbalanced", None),
    ("no box", None),
])
def test_last_boxed_content(text, content):
    assert math.last_boxed_content(text) == content


@pytest.mark.parametrize("response, truth, score", [
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12", 1.0),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
    (r"\boxed{(1,2)}", "(1, 2)", 1.0),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    (r"\boxed{3}", "4", 0.0),
    ("the answer is 1/2", r"\frac{1}{2}", 0.0),  # no boxed answer
])
def test_math_equivalence_with_math_verify(response, truth, score):
    assert math.load_math_verify() is not None
    assert math.compute_score(response, truth) == score


def test_math_fallback_compares_normalized_strings(monkeypatch, caplog):
    monkeypatch.setattr(math, "load_math_verify", lambda: None)
    monkeypatch.setattr(math, "_warned_fallback", False)
    with caplog.at_level(logging.WARNING):
        assert math.compute_score(r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}") == 1.0
        assert math.compute_score(r"\boxed{ 90^\circ }", "90") == 1.0
        assert math.compute_score(r"\boxed{\text{(B)}}", "(B)") == 1.0
        assert math.compute_score(r"\boxed{5.00}", "5") == 1.0
        assert math.compute_score(r"\boxed{0.5}", r"\frac{1}{2}") == 0.0  # the fallback cannot see this
    assert caplog.text.count("math-verify is not installed") == 1


def test_format_scores():
    assert fmt.think_answer_format_score("<think>a</think> <answer>b</answer>") == 1.0
    assert fmt.think_answer_format_score("<think>a</think><answer>b</answer><answer>c</answer>") == 0.0
    assert fmt.think_answer_format_score("<answer>b</answer>") == 0.0
    assert fmt.boxed_format_score(r"x \boxed{1}", score=0.5) == 0.5
    assert fmt.boxed_format_score(r"\boxed{1} \boxed{2}") == 0.0
    assert fmt.boxed_format_score(r"\boxed{1") == 0.0
    assert fmt.gsm8k_format_score("work\n#### 1,200\n") == 1.0
    assert fmt.gsm8k_format_score("#### twelve") == 0.0
    assert fmt.regex_format_score("12\nyes", r"\d+\n(yes|no)") == 1.0
    assert fmt.regex_format_score("12 yes", r"\d+\n(yes|no)") == 0.0


def test_synthetic_exact_match():
    assert synthetic.compute_score(" 85 ", "85") == 1.0
    assert synthetic.compute_score("85 1", "85") == 0.0
    assert synthetic.compute_score("", "85") == 0.0
