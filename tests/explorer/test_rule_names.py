"""Each rule lives in the module named after its id, so a finding leads to its code."""

from neuron_explorer.rules import RULES
from neuron_explorer.rules.ranks import RANK_RULES


def test_each_rule_module_is_named_after_its_rule_id() -> None:
    for rule in (*RULES, *RANK_RULES):
        assert rule.__name__.rsplit(".", 1)[-1] == rule.RULE_ID, rule.__name__
