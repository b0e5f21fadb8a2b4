"""Kafka's ssl.principal.mapping.rules, as lowtide parses and applies them."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidConfig, SaslAuthenticationFailed
from lowtide.tls.principal import LOWTIDE_RULES, PrincipalMapper, parse_rules


def test_default_maps_a_subject_to_its_whole_distinguished_name():
    assert PrincipalMapper().principal_of_subject("CN=alice,O=lowtide") == "User:CN=alice,O=lowtide"


def test_lowtide_rules_map_a_lowtide_certificate_to_its_common_name():
    mapper = PrincipalMapper(LOWTIDE_RULES)
    assert mapper.principal_of_subject("CN=broker-1,O=lowtide") == "User:broker-1"
    # a subject of another organisation falls through to DEFAULT, so it cannot pose as a broker
    assert mapper.principal_of_subject("CN=broker-1,O=evil") == "User:CN=broker-1,O=evil"


def test_rules_apply_in_order_with_group_references_and_case_flags():
    rules = "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, RULE:^CN=(.*?),OU=(.*?),O=.*$/$2-$1/U,DEFAULT"
    mapper = PrincipalMapper(rules)
    assert mapper.name_of("CN=Kafka-Svc,OU=ServiceUsers,O=Unknown") == "kafka-svc"
    assert mapper.name_of("CN=Bob,OU=Ops,O=Acme") == "OPS-BOB"
    assert mapper.name_of("CN=Carol") == "CN=Carol"


def test_a_rule_must_match_the_whole_subject():
    mapper = PrincipalMapper("RULE:CN=admin/admin/")
    with pytest.raises(SaslAuthenticationFailed, match="no ssl.principal.mapping.rules rule matches"):
        mapper.name_of("CN=admin,O=lowtide")


def test_no_matching_rule_refuses_the_client():
    with pytest.raises(SaslAuthenticationFailed):
        PrincipalMapper("RULE:^CN=(x)$/$1/").principal_of_subject("CN=y")


@pytest.mark.parametrize("rules", ["", "RULE:", "RULE:a/b", "NONSENSE", "RULE:(/x/", "DEFAULT,,DEFAULT"])
def test_malformed_rules_are_an_invalid_config_naming_the_problem(rules):
    with pytest.raises(InvalidConfig, match="ssl.principal.mapping.rules"):
        parse_rules(rules)


def test_a_pattern_may_contain_commas():
    assert len(parse_rules("RULE:^CN=([^,]+),O=lowtide$/$1/,DEFAULT")) == 2
