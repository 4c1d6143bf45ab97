// sqbox doctor's readers of kernel settings and its diagnoses (runtime/host_checks.h): what each
// blocker found leads to, and the fix named.
#include "runtime/host_checks.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <fstream>
#include <iterator>

namespace sqbox {
namespace {

TEST(HostProbes, SysctlValues) {
    EXPECT_EQ(parse_sysctl_value("0\n"), 0);
    EXPECT_EQ(parse_sysctl_value("1"), 1);
    EXPECT_EQ(parse_sysctl_value(" 15000 \n"), 15000);
    EXPECT_EQ(parse_sysctl_value("2147483647\n"), 2147483647L);
    EXPECT_EQ(parse_sysctl_value(""), std::nullopt);
    EXPECT_EQ(parse_sysctl_value("\n"), std::nullopt);
    EXPECT_EQ(parse_sysctl_value("1 2\n"), std::nullopt);
    EXPECT_EQ(parse_sysctl_value("yes"), std::nullopt);
}

TEST(HostProbes, SeccompModeOfProcStatus) {
    const std::string status =
        "Name:\tsqbox\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\nSpeculation_Store_Bypass:"
        "\tthread force mitigated\n";
    EXPECT_EQ(parse_seccomp_mode(status), 2);
    EXPECT_EQ(parse_seccomp_mode("Name:\tbash\nSeccomp:\t0\n"), 0);
    // Seccomp_filters alone is not the mode; a kernel without seccomp has neither line.
    EXPECT_EQ(parse_seccomp_mode("Name:\tbash\nSeccomp_filters:\t3\n"), std::nullopt);
    EXPECT_EQ(parse_seccomp_mode("Seccomp:\t7\n"), std::nullopt);
}

TEST(HostProbes, AppArmorProfileList) {
    const auto profiles = parse_apparmor_profiles(
        "sqbox (unconfined)\n"
        "/usr/bin/man (enforce)\n"
        "unprivileged_userns (enforce)\n"
        "/opt/my tools/sqbox (complain)\n"
        "\n"
        "odd line without mode\n");
    ASSERT_EQ(profiles.size(), 5U);
    EXPECT_EQ(profiles[0].name, "sqbox");
    EXPECT_EQ(profiles[0].mode, "unconfined");
    EXPECT_EQ(profiles[1].name, "/usr/bin/man");
    EXPECT_EQ(profiles[1].mode, "enforce");
    EXPECT_EQ(profiles[3].name, "/opt/my tools/sqbox");
    EXPECT_EQ(profiles[3].mode, "complain");
    EXPECT_EQ(profiles[4].name, "odd line without mode");
    EXPECT_EQ(profiles[4].mode, "");
    EXPECT_TRUE(parse_apparmor_profiles("").empty());
}

TEST(HostProbes, AppArmorLabels) {
    EXPECT_EQ(parse_apparmor_label("unconfined\n"), "unconfined");
    EXPECT_EQ(parse_apparmor_label("sqbox (unconfined)\n"), "sqbox");
    EXPECT_EQ(parse_apparmor_label(std::string("docker-default (enforce)\n\0", 26)),
              "docker-default");
    EXPECT_EQ(parse_apparmor_label("/usr/bin/sqbox (enforce)"), "/usr/bin/sqbox");
}

TEST(HostProbes, InitialUserNamespaceMap) {
    EXPECT_TRUE(is_initial_uid_map("         0          0 4294967295\n"));
    EXPECT_FALSE(is_initial_uid_map("         0       1000          1\n"));
    EXPECT_FALSE(is_initial_uid_map("         0          0      65536\n"));
    EXPECT_FALSE(is_initial_uid_map("0 0 4294967295\n1 1 1\n"));
    EXPECT_FALSE(is_initial_uid_map(""));
}

// A refused user namespace on an unprivileged Ubuntu-like host, unless a test changes it.
UserNamespaceFacts refused(int error) {
    UserNamespaceFacts facts;
    facts.probe = {false, error, "cannot create a user namespace: refused"};
    facts.max_user_namespaces = 63000;
    facts.seccomp_mode = 0;
    facts.executable = "/usr/bin/sqbox";
    return facts;
}

TEST(HostChecks, UserNamespacesThatWork) {
    UserNamespaceFacts facts;
    facts.probe = {true, 0, ""};
    const HostCheck check = diagnose_user_namespaces(facts);
    EXPECT_EQ(check.status, CheckStatus::kOk);
    EXPECT_EQ(check.fix, "");
    EXPECT_EQ(check.found.find("AppArmor"), std::string::npos);
}

TEST(HostChecks, AppArmorProfileThatAllowsThemIsNamed) {
    UserNamespaceFacts facts;
    facts.probe = {true, 0, ""};
    facts.apparmor_restrict = 1;
    facts.apparmor_label = "sqbox";
    const HostCheck check = diagnose_user_namespaces(facts);
    EXPECT_EQ(check.status, CheckStatus::kOk);
    EXPECT_NE(check.found.find("allowed by the AppArmor profile 'sqbox'"), std::string::npos);
}

TEST(HostChecks, MaxUserNamespacesZero) {
    UserNamespaceFacts facts = refused(ENOSPC);
    facts.max_user_namespaces = 0;
    const HostCheck check = diagnose_user_namespaces(facts);
    EXPECT_EQ(check.status, CheckStatus::kMissing);
    EXPECT_NE(check.found.find("user.max_user_namespaces is 0"), std::string::npos);
    EXPECT_NE(check.fix.find("sysctl -w user.max_user_namespaces=15000"), std::string::npos);
}

TEST(HostChecks, UnprivilegedUsernsCloneZeroBindsOnlyUnprivilegedUsers) {
    UserNamespaceFacts facts = refused(EPERM);
    facts.unprivileged_userns_clone = 0;
    HostCheck check = diagnose_user_namespaces(facts);
    EXPECT_NE(check.found.find("kernel.unprivileged_userns_clone is 0"), std::string::npos);
    EXPECT_NE(check.fix.find("sysctl -w kernel.unprivileged_userns_clone=1"), std::string::npos);
    facts.root = true;  // not what stopped root
    check = diagnose_user_namespaces(facts);
    EXPECT_EQ(check.found.find("unprivileged_userns_clone"), std::string::npos);
}

TEST(HostChecks, AppArmorRestrictionWithoutProfileNamesTheProfileToInstall) {
    UserNamespaceFacts facts = refused(EPERM);
    facts.apparmor_restrict = 1;
    facts.apparmor_label = "unconfined";
    facts.apparmor_profiles = {{"/usr/bin/man", "enforce"}, {"unprivileged_userns", "enforce"}};
    const HostCheck check = diagnose_user_namespaces(facts);
    EXPECT_EQ(check.status, CheckStatus::kMissing);
    EXPECT_NE(check.found.find("kernel.apparmor_restrict_unprivileged_userns = 1"),
              std::string::npos);
    EXPECT_NE(check.found.find("no profile applies to /usr/bin/sqbox"), std::string::npos);
    EXPECT_NE(check.fix.find("/etc/apparmor.d/sqbox"), std::string::npos);
    EXPECT_NE(check.fix.find("apparmor_parser -r /etc/apparmor.d/sqbox"), std::string::npos);
}

TEST(HostChecks, AppArmorProfileLoadedForAnotherPath) {
    UserNamespaceFacts facts = refused(EPERM);
    facts.apparmor_restrict = 1;
    facts.apparmor_label = "unconfined";
    facts.executable = "/home/me/sqbox/build/sqbox";
    facts.apparmor_profiles = {{"sqbox", "unconfined"}};
    const HostCheck check = diagnose_user_namespaces(facts);
    EXPECT_NE(check.found.find("sqbox's profile is there for another path"), std::string::npos);
    EXPECT_NE(check.fix.find("add /home/me/sqbox/build/sqbox to that profile"), std::string::npos);
}

TEST(HostChecks, AppArmorProfileInstalledButNotLoaded) {
    // An ordinary user cannot read the loaded profiles, but can read the installed one.
    UserNamespaceFacts facts = refused(EPERM);
    facts.apparmor_restrict = 1;
    facts.apparmor_label = "unconfined";
    facts.installed_profile =
        "abi <abi/4.0>,\nprofile sqbox /usr/bin/sqbox flags=(unconfined) {\n"
        "  userns,\n}\n";
    HostCheck check = diagnose_user_namespaces(facts);
    EXPECT_NE(check.found.find("/etc/apparmor.d/sqbox names it but is not loaded"),
              std::string::npos);
    EXPECT_EQ(check.fix, "load it: sudo apparmor_parser -r /etc/apparmor.d/sqbox");
    // Run from a build tree: the installed profile is for another path.
    facts.executable = "/home/me/sqbox/build/sqbox";
    check = diagnose_user_namespaces(facts);
    EXPECT_NE(check.found.find("sqbox's profile is there for another path"), std::string::npos);
    EXPECT_NE(check.fix.find("add /home/me/sqbox/build/sqbox to that profile"), std::string::npos);
}

TEST(HostChecks, AppArmorRestrictionDoesNotBindRoot) {
    UserNamespaceFacts facts = refused(EPERM);
    facts.apparmor_restrict = 1;
    facts.apparmor_label = "unconfined";
    facts.root = true;
    facts.seccomp_mode = 2;
    const HostCheck check = diagnose_user_namespaces(facts);
    EXPECT_EQ(check.found.find("apparmor_restrict"), std::string::npos);
    EXPECT_NE(check.found.find("seccomp filter"), std::string::npos);
}

TEST(HostChecks, ContainerSeccompProfile) {
    UserNamespaceFacts facts = refused(EPERM);
    facts.seccomp_mode = 2;
    const HostCheck check = diagnose_user_namespaces(facts);
    EXPECT_EQ(check.status, CheckStatus::kMissing);
    EXPECT_NE(check.found.find("Seccomp: 2"), std::string::npos);
    EXPECT_NE(check.fix.find("securityContext.seccompProfile.type: Unconfined"), std::string::npos);
    // Not a seccomp refusal: a filter returns EPERM here, not ENOSPC.
    facts.probe.error = ENOSPC;
    EXPECT_EQ(diagnose_user_namespaces(facts).found.find("Seccomp: 2"), std::string::npos);
}

TEST(HostChecks, ContainerAppArmorProfile) {
    UserNamespaceFacts facts = refused(EPERM);
    facts.apparmor_label = "docker-default";
    const HostCheck check = diagnose_user_namespaces(facts);
    EXPECT_NE(check.found.find("AppArmor profile 'docker-default'"), std::string::npos);
    EXPECT_NE(check.fix.find("appArmorProfile.type: Unconfined"), std::string::npos);
}

TEST(HostChecks, UnexplainedRefusalKeepsTheKernelsWords) {
    const HostCheck check = diagnose_user_namespaces(refused(EINVAL));
    EXPECT_EQ(check.status, CheckStatus::kMissing);
    EXPECT_NE(check.found.find("cannot create a user namespace: refused"), std::string::npos);
    EXPECT_FALSE(check.fix.empty());
}

TEST(HostChecks, FreshProc) {
    EXPECT_EQ(diagnose_fresh_proc({true, 0, ""}).status, CheckStatus::kOk);
    const HostCheck masked =
        diagnose_fresh_proc({false, EPERM, "cannot mount /proc (proc): Operation not permitted"});
    EXPECT_EQ(masked.status, CheckStatus::kMissing);
    EXPECT_NE(masked.fix.find("procMount: Unmasked"), std::string::npos);
    EXPECT_NE(masked.fix.find("hostUsers: false"), std::string::npos);
    EXPECT_NE(masked.action.find("--proc"), std::string::npos);
    EXPECT_EQ(diagnose_fresh_proc({false, ENODEV, "no"}).fix.find("procMount"), std::string::npos);
}

TEST(HostChecks, OverlayfsRefusedIsDegraded) {
    EXPECT_EQ(diagnose_overlayfs({true, 0, ""}).status, CheckStatus::kOk);
    const HostCheck check = diagnose_overlayfs({false, ENODEV, "cannot create overlayfs"});
    EXPECT_EQ(check.status, CheckStatus::kDegraded);
    EXPECT_NE(check.action.find("read-only root"), std::string::npos);
}

TEST(HostChecks, RunWorksUnlessSomethingIsMissing) {
    std::vector<HostCheck> checks = {{"a", CheckStatus::kOk, "", "", ""},
                                     {"b", CheckStatus::kDegraded, "", "", ""}};
    EXPECT_TRUE(run_will_work(checks));
    checks.push_back({"c", CheckStatus::kSkipped, "", "", ""});
    EXPECT_FALSE(run_will_work(checks));
    checks.back().status = CheckStatus::kMissing;
    EXPECT_FALSE(run_will_work(checks));
}

TEST(HostChecks, ThePackagedProfileAttachesWhereThePackagesInstall) {
    std::ifstream file(SQBOX_APPARMOR_PROFILE);
    ASSERT_TRUE(file) << SQBOX_APPARMOR_PROFILE;
    const std::string profile((std::istreambuf_iterator<char>(file)),
                              std::istreambuf_iterator<char>());
    EXPECT_TRUE(profile_attaches_to(profile, "/usr/bin/sqbox"));
    EXPECT_TRUE(profile_attaches_to(profile, "/usr/local/bin/sqbox"));
    EXPECT_FALSE(profile_attaches_to(profile, "/home/me/sqbox/build/sqbox"));
    EXPECT_FALSE(profile_attaches_to(profile, "/usr/bin/sqboxx"));
    EXPECT_TRUE(profile_attaches_to("/opt/*/bin/sqbox flags=(unconfined) {\n", "/opt/x/bin/sqbox"));
    EXPECT_FALSE(profile_attaches_to("/opt/*/bin/sqbox {\n", "/opt/x/y/bin/sqbox"));
}

}  // namespace
}  // namespace sqbox
