import typing
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.bcp import (
    CONTENT_MODELS,
    JSON_SAFE_INT,
    MAX_WORDS_LIMIT,
    UNTRUSTED_NOTICE,
    ActiveSubscription,
    AnomalyCode,
    BcpApprovalDecision,
    BcpApprovalRequest,
    BcpMessageType,
    BcpQuery,
    BcpQueryFailed,
    BcpQueryRequest,
    BcpResponse,
    BcpResponseDelivery,
    BcpSubscriptionsActive,
    BcpValidationResult,
    DecisionRefusal,
    QuerySpec,
    ReasonCode,
    SpecField,
    ValidationCode,
)

CAT1: dict[str, Any] = {
    "category": 1,
    "fields": [
        {"name": "is_urgent", "type": "boolean"},
        {"name": "sentiment", "type": "enum", "values": ["positive", "neutral", "negative"]},
        {"name": "confidence", "type": "integer", "min": 1, "max": 5},
    ],
}
CAT2: dict[str, Any] = {
    "category": 2,
    "questions": [
        {
            "id": "q1",
            "question": "What is the sender's full name?",
            "max_words": 5,
            "expected_format": "person_name",
        },
        {"id": "q2", "question": "When?", "max_words": 4, "expected_format": "date"},
    ],
}
CAT3: dict[str, Any] = {
    "category": 3,
    "directive": "Summarize the key findings of this document.",
    "max_words": 100,
    "requires_approval": True,
}


def spec_error(data: dict[str, Any]) -> Any:
    with pytest.raises(ValidationError) as info:
        QuerySpec.model_validate(data)
    return info.value.errors(include_url=False)[0]


@pytest.mark.parametrize("data", [CAT1, CAT2, CAT3])
def test_seed_specs_validate(data):
    """The wire format examples of the BCP specification are valid specs."""
    spec = QuerySpec.model_validate(data)
    assert spec.category == data["category"]
    assert spec.model_dump(mode="json", exclude_none=True) == data


def test_response_keys_follow_the_spec_order():
    """An answer's keys are the field names, question ids, or summary, in spec order."""
    assert QuerySpec.model_validate(CAT1).response_keys() == (
        "is_urgent",
        "sentiment",
        "confidence",
    )
    assert QuerySpec.model_validate(CAT2).response_keys() == ("q1", "q2")
    assert QuerySpec.model_validate(CAT3).response_keys() == ("summary",)


@pytest.mark.parametrize("category", [True, 1.0, "1", 0, 4, None])
def test_category_must_be_the_integer_1_2_or_3(category):
    """A category is exactly 1, 2 or 3 as a JSON integer; true and 1.0 are not 1."""
    spec_error({**CAT1, "category": category})


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({**CAT1, "questions": CAT2["questions"]}, "questions"),
        ({**CAT1, "max_words": 3}, "max_words"),
        ({**CAT2, "fields": CAT1["fields"]}, "fields"),
        ({**CAT2, "directive": "x"}, "directive"),
        ({**CAT3, "fields": CAT1["fields"]}, "fields"),
        ({**CAT2, "requires_approval": True}, "requires_approval"),
        ({"category": 1, "fields": []}, "fields"),
        ({"category": 1}, "fields"),
        ({"category": 2, "questions": []}, "questions"),
        ({"category": 3, "max_words": 10}, "directive"),
        ({"category": 3, "directive": "x"}, "max_words"),
    ],
)
def test_a_spec_has_exactly_its_categorys_keys(data, path):
    """Each category has its own keys, all required, and none of another category's."""
    error = spec_error(data)
    assert error["type"] == "invalid_spec"
    assert error["ctx"]["path"] == path


def test_requires_approval_cannot_be_turned_off():
    """A Cat-3 spec may say requires_approval: true, never false."""
    spec_error({**CAT3, "requires_approval": False})


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ({"name": "n", "type": "integer", "min": 1}, "max"),
        ({"name": "n", "type": "integer", "max": 1}, "min"),
        ({"name": "n", "type": "integer", "min": 5, "max": 1}, "min"),
        ({"name": "n", "type": "integer", "min": 1, "max": 2, "values": ["a"]}, "values"),
        ({"name": "e", "type": "enum"}, "values"),
        ({"name": "e", "type": "enum", "values": []}, "values"),
        ({"name": "e", "type": "enum", "values": ["a", "b", "a"]}, "values[2]"),
        ({"name": "e", "type": "enum", "values": ["a"], "min": 1}, "min"),
        ({"name": "b", "type": "boolean", "values": ["a"]}, "values"),
        ({"name": "b", "type": "boolean", "max": 1}, "max"),
    ],
)
def test_field_definitions_are_consistent(field, path):
    """Integers need min <= max, enums need distinct values, and no type has another's keys."""
    error = spec_error({"category": 1, "fields": [field]})
    assert error["ctx"]["path"] == path
    assert error["loc"] == ("fields", 0)


@pytest.mark.parametrize(
    "field",
    [
        {"name": "x", "type": "float"},
        {"name": "x", "type": "boolean", "extra": 1},
        {"name": "1x", "type": "boolean"},
        {"name": "x", "type": "integer", "min": 0, "max": JSON_SAFE_INT + 1},
        {"name": "x", "type": "integer", "min": 0.5, "max": 2},
        {"name": "x", "type": "integer", "min": True, "max": 2},
        {"name": "x", "type": "enum", "values": [True, False]},
        {"name": "x", "type": "enum", "values": [""]},
    ],
)
def test_field_types_and_bounds_are_checked(field):
    """Unknown types, unknown keys, bad names, unsafe or non-integer bounds are refused."""
    spec_error({"category": 1, "fields": [field]})


def test_duplicate_field_names_are_refused():
    """Two fields with one name are refused at the second."""
    fields = [{"name": "a", "type": "boolean"}, {"name": "a", "type": "boolean"}]
    assert spec_error({"category": 1, "fields": fields})["ctx"]["path"] == "fields[1].name"


def test_duplicate_question_ids_are_refused():
    """Two questions with one id are refused at the second."""
    questions = [CAT2["questions"][0], {**CAT2["questions"][1], "id": "q1"}]
    assert spec_error({"category": 2, "questions": questions})["ctx"]["path"] == "questions[1].id"


@pytest.mark.parametrize(("same_as", "path"), [("q9", "questions[1].same_as"), ("q2", "same_as")])
def test_same_as_must_name_another_question(same_as, path):
    """same_as names an existing question other than itself."""
    questions = [CAT2["questions"][0], {**CAT2["questions"][1], "same_as": same_as}]
    assert spec_error({"category": 2, "questions": questions})["ctx"]["path"] == path


def test_unknown_expected_format_is_refused():
    """An unknown expected_format is an error, not a pass."""
    questions = [{**CAT2["questions"][0], "expected_format": "url"}]
    error = spec_error({"category": 2, "questions": questions})
    assert error["loc"] == ("questions", 0, "expected_format")


@pytest.mark.parametrize("max_words", [0, -1, MAX_WORDS_LIMIT + 1, 2.0, "5", True])
def test_max_words_is_a_bounded_positive_integer(max_words):
    """max_words is an integer from 1 to MAX_WORDS_LIMIT."""
    spec_error({**CAT3, "max_words": max_words})


def test_top_level_max_words_is_the_default_for_questions():
    """A Cat-2 max_words fills in questions that omit theirs; their own value wins."""
    spec = QuerySpec.model_validate(
        {
            "category": 2,
            "max_words": 7,
            "questions": [
                {"id": "a", "question": "?", "expected_format": "short_text"},
                {"id": "b", "question": "?", "expected_format": "short_text", "max_words": 2},
            ],
        }
    )
    assert [q.max_words for q in spec.questions or ()] == [7, 2]


def test_a_question_needs_max_words_from_somewhere():
    """Without its own or a default max_words, a question is refused."""
    questions = [{"id": "a", "question": "?", "expected_format": "short_text"}]
    spec_error({"category": 2, "questions": questions})


def test_as_spec_drops_the_carriers_fields():
    """as_spec() returns the bare spec of a query request or subscription entry."""
    request = BcpQueryRequest.model_validate({"query_id": "q-1", "task_id": "t", **CAT1})
    assert request.as_spec() == QuerySpec.model_validate(CAT1)
    spec = QuerySpec.model_validate(CAT1)
    assert spec.as_spec() is spec


@pytest.mark.parametrize("spec", [CAT1, CAT2, CAT3], ids=["cat1", "cat2", "cat3"])
def test_as_spec_is_the_spec_validated_on_its_own(spec):
    """The bare spec copied out of a request equals, and dumps exactly as, the same spec
    validated by itself (its Cat-2 questions' default max_words filled in as well)."""
    bare = BcpQueryRequest.model_validate({"query_id": "q-1", **spec}).as_spec()
    alone = QuerySpec.model_validate(spec)
    assert type(bare) is QuerySpec
    assert bare == alone and bare.model_fields_set == alone.model_fields_set
    for mode in ("python", "json"):
        assert bare.model_dump(mode=mode, exclude_unset=True) == alone.model_dump(
            mode=mode, exclude_unset=True
        )


def test_bounds_of_a_non_integer_field_raise():
    """bounds() is for integer fields only."""
    with pytest.raises(ValueError, match="not an integer"):
        SpecField(name="b", type="boolean").bounds()
    assert SpecField(name="n", type="integer", min=-3, max=3).bounds() == (-3, 3)


def test_specs_are_immutable():
    """Specs are frozen: a validated spec cannot be changed afterwards."""
    spec = QuerySpec.model_validate(CAT1)
    with pytest.raises(ValidationError):
        spec.category = 3  # type: ignore[misc]


# Message contents


def test_query_request_carries_its_spec_flat():
    """bcp_query_request is the spec plus query_id, task_id and escalation_justification."""
    request = BcpQueryRequest.model_validate(
        {**CAT3, "query_id": "q-1", "task_id": "task-7", "escalation_justification": "why"}
    )
    assert request.directive == CAT3["directive"]
    with pytest.raises(ValidationError):
        BcpQueryRequest.model_validate({**CAT1, "query_id": "has space"})
    with pytest.raises(ValidationError):
        BcpQueryRequest.model_validate(CAT1)


def test_query_to_the_reader_names_the_controller():
    """bcp_query carries query_id, controller and the spec."""
    query = BcpQuery.model_validate({**CAT2, "query_id": "q-1", "controller": "main"})
    assert query.controller == "main"


@pytest.mark.parametrize(
    "content",
    [
        {"query_id": "abc123", "response": {"status": "ok"}},
        {
            "subscription_id": "research-findings",
            "controller": "main",
            "response": {"q1": "Quantum computing breakthrough", "q3": "4"},
        },
        {"query_id": "abc123", "response": ["anything", {"at": "all"}]},
        {"query_id": "abc123", "response": None},
    ],
)
def test_bcp_response_accepts_the_seed_shapes_and_any_response(content):
    """A reader's answer has query_id, or subscription_id + controller; response is untyped."""
    assert BcpResponse.model_validate(content).response == content["response"]


@pytest.mark.parametrize(
    "content",
    [
        {"response": {}},
        {"query_id": "a", "subscription_id": "b", "controller": "main", "response": {}},
        {"subscription_id": "research-findings", "response": {}},
        {"query_id": "a", "controller": "main", "response": {}},
        {"query_id": "a"},
        {"query_id": "a", "response": {}, "extra": 1},
    ],
)
def test_bcp_response_refuses_ambiguous_ids(content):
    """Exactly one id; controller only with subscription_id; response required; no extras."""
    with pytest.raises(ValidationError):
        BcpResponse.model_validate(content)


def test_validation_result_matches_the_seed():
    """bcp_validation_result echoes one id; error is set exactly when success is false."""
    ok = BcpValidationResult.model_validate(
        {
            "subscription_id": "research-findings",
            "success": True,
            "detail": "Published to controller main (Cat-2, 671.0 bits)",
        }
    )
    assert ok.error is None
    failed = BcpValidationResult(
        query_id="abc123",
        success=False,
        error=ReasonCode.VALIDATION_FAILED,
        reasons=[{"field": "q1", "code": "too_many_words", "message": "12 words"}],
        retries_left=2,
    )
    assert failed.reasons[0].code is ValidationCode.TOO_MANY_WORDS
    with pytest.raises(ValidationError):
        BcpValidationResult(query_id="a", success=False)
    with pytest.raises(ValidationError):
        BcpValidationResult(query_id="a", success=True, error=ReasonCode.TIMEOUT)


def test_delivery_matches_the_seed():
    """bcp_response_delivery carries the normalized answer, bits, taint and channel_mode bcp."""
    delivery = BcpResponseDelivery.model_validate(
        {
            "subscription_id": "research-findings",
            "category": 2,
            "from_agent": "researcher",
            "response": {"q1": "Quantum computing breakthrough", "q3": "4"},
            "bandwidth_bits": 671.0,
            "taint": "medium",
        }
    )
    assert delivery.channel_mode == "bcp"
    dumped = delivery.model_dump(mode="json", exclude_defaults=True)
    assert list(dumped) == [
        "subscription_id",
        "category",
        "from_agent",
        "response",
        "bandwidth_bits",
        "taint",
    ]


@pytest.mark.parametrize(
    "change",
    [
        {"response": {"q": ["nested"]}},
        {"response": {"q": None}},
        {"response": {"q": 1.5}},
        {"channel_mode": "raw"},
        {"taint": "extreme"},
        {"bandwidth_bits": -1},
        {"query_id": "q-1"},
    ],
)
def test_delivery_refuses_anything_but_normalized_values(change):
    """A delivery holds only booleans, integers and strings, one id, and mode bcp."""
    content = {
        "subscription_id": "s",
        "category": 1,
        "from_agent": "researcher",
        "response": {"q": True},
        "bandwidth_bits": 1.0,
        "taint": "medium",
    }
    with pytest.raises(ValidationError):
        BcpResponseDelivery.model_validate({**content, **change})


def test_query_failed_carries_a_reason_code():
    """bcp_query_failed has a query_id and one of the reason codes."""
    failed = BcpQueryFailed(query_id="q-1", error="budget_exhausted", detail="3 bits left")
    assert failed.error is ReasonCode.BUDGET_EXHAUSTED
    with pytest.raises(ValidationError):
        BcpQueryFailed(query_id="q-1", error="made_up")


def test_subscriptions_active_matches_the_seed():
    """bcp_subscriptions_active lists subscription_id, controller, category and the spec."""
    seed = {
        "subscriptions": [
            {
                "subscription_id": "research-findings",
                "controller": "main",
                "category": 2,
                "questions": [
                    {
                        "id": "q1",
                        "question": "What is the topic?",
                        "max_words": 10,
                        "expected_format": "short_text",
                    },
                ],
            },
            {
                "subscription_id": "research-alerts",
                "controller": "main",
                "category": 1,
                "fields": [{"name": "has_new_results", "type": "boolean"}],
            },
        ]
    }
    active = BcpSubscriptionsActive.model_validate(seed)
    assert active.model_dump(mode="json", exclude_none=True) == seed
    assert isinstance(active.subscriptions[0], ActiveSubscription)
    assert BcpSubscriptionsActive().subscriptions == ()


def test_approval_request_labels_the_text_as_untrusted():
    """An approval request carries the normalized text, labelled untrusted."""
    request = BcpApprovalRequest(
        approval_id="ap-1",
        kind="response",
        controller="main",
        reader="researcher",
        query_id="q-1",
        spec=QuerySpec.model_validate(CAT3),
        response={"summary": "A summary."},
    )
    assert request.untrusted is True
    assert request.notice == UNTRUSTED_NOTICE
    assert "UNTRUSTED" in request.model_dump(mode="json")["notice"]


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "response", "response": None},
        {"kind": "escalation", "escalation_justification": None},
        {"query_id": None},
        {"untrusted": False},
    ],
)
def test_approval_request_is_complete(change):
    """A response approval has the response; an escalation its justification; one id."""
    content = {
        "approval_id": "ap-1",
        "kind": "escalation",
        "controller": "main",
        "reader": "researcher",
        "query_id": "q-1",
        "spec": CAT3,
        "escalation_justification": "Cat-2 could not express the need.",
        "from_category": 2,
        "response": {"summary": "text"},
        **change,
    }
    with pytest.raises(ValidationError):
        BcpApprovalRequest.model_validate(content)


def test_approval_decision_edit_needs_the_edited_response():
    """Approve and reject stand alone; edit carries the edited response, and only edit does."""
    assert BcpApprovalDecision(approval_id="ap-1", decision="approve").edited_response is None
    edit = BcpApprovalDecision(
        approval_id="ap-1", decision="edit", edited_response={"summary": "Edited."}
    )
    assert edit.edited_response == {"summary": "Edited."}
    with pytest.raises(ValidationError):
        BcpApprovalDecision(approval_id="ap-1", decision="edit")
    with pytest.raises(ValidationError):
        BcpApprovalDecision(approval_id="ap-1", decision="reject", edited_response={})
    with pytest.raises(ValidationError):
        BcpApprovalDecision(approval_id="ap-1", decision="maybe")


def test_reason_codes_cover_the_flow():
    """Every refusal and failure the gateway needs has a code, spelled as on the wire."""
    expected = {
        "unknown_channel",
        "not_channel_controller",
        "category_not_allowed",
        "invalid_spec",
        "budget_exhausted",
        "cat2_limit_reached",
        "escalation_requires_justification",
        "escalation_limit_reached",
        "escalation_rejected",
        "timeout",
        "retries_exhausted",
        "approval_rejected",
        "reader_unavailable",
        "subscription_not_found",
        "validation_failed",
        "rate_limited",
        "controller_unavailable",
        "duplicate_query_id",
    }
    assert expected <= {code.value for code in ReasonCode}
    assert {code.value for code in DecisionRefusal} == {
        "invalid_decision",
        "unknown_approval",
        "already_decided",
        "invalid_edit",
    }
    # A refused decision is the gateway's reply to an approver, never a controller's or reader's.
    assert not {code.value for code in DecisionRefusal} & {code.value for code in ReasonCode}
    for enum in (ReasonCode, ValidationCode, AnomalyCode, DecisionRefusal):
        assert all(code.value == code.name.lower() for code in enum)
        assert all(f"``{code.value}``" in (enum.__doc__ or "") for code in enum)


def test_every_message_type_has_a_content_model():
    """CONTENT_MODELS maps each BCP payload type to its model, and each has a JSON Schema."""
    assert set(CONTENT_MODELS) == set(typing.get_args(BcpMessageType))
    for model in CONTENT_MODELS.values():
        schema = model.model_json_schema()
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
