package bench

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers/aws/fakeec2"
	"github.com/example/egress-proxies-operator/providers/squidconf"
	"github.com/example/egress-proxies-operator/test/cluster"
)

const (
	awsBenchProvider = "aws-bench"
	awsBenchRegion   = "eu-west-1"
	awsBenchZone     = "eu-west-1a"
)

// BenchmarkReconcileAWS1000 brings 1,000 Managed Proxies on an aws provider
// instance to Ready (their instances run on the fake EC2 API, each played by
// an in-process proxy on its public IP, then probed Healthy), and compares
// the time with a bare loop on the same fake: for each proxy, the Proxy's
// create, its lease key's PutParameter and RunInstances through the SDK,
// DescribeInstances until it runs with its public IP, and the Proxy's
// status.
func BenchmarkReconcileAWS1000(b *testing.B) { benchAWS(b, 1000) }

func benchAWS(b *testing.B, n int) {
	fake := fakeec2.New()
	api := httptest.NewServer(fake)
	b.Cleanup(api.Close)
	w := newWorld(b, cluster.Options{ExtraProviders: cluster.AWSProvider(awsBenchProvider, awsBenchRegion, awsBenchZone, api.URL)})
	runner := cluster.NewEC2Runner(fake)
	go runner.Run(b.Context())
	b.Cleanup(runner.CloseAll)
	creds := credentials.NewStaticCredentialsProvider(fakeec2.SDKAccessKey, fakeec2.SDKSecretKey, "")
	sdk := bareSDK{ec2: ec2.New(ec2.Options{Region: awsBenchRegion, BaseEndpoint: awssdk.String(api.URL), Credentials: creds}),
		ssm: ssm.New(ssm.Options{Region: awsBenchRegion, BaseEndpoint: awssdk.String(api.URL), Credentials: creds})}
	c := w.cluster.Env.Client
	ctx := context.Background()
	newProxy := func(ns string, i int) *crawlv1alpha1.Proxy {
		return &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("px-%04d", i)},
			Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: awsBenchProvider, Port: crawlv1alpha1.DefaultPort,
				Attributes: map[string]string{"bench": "aws"}}}
	}

	var bareTime, opTime time.Duration
	var bareCalls, opCalls float64
	round := 0
	for b.Loop() {
		round++
		bareNS := fmt.Sprintf("bare-aws-%d", round)
		mustNamespace(b, c, bareNS)
		bareReady := watchReady(b, w.cluster, bareNS, n)
		calls0 := ec2Calls(fake)
		t0 := time.Now()
		if err := forEach(n, func(i int) error { return bareEC2BringUp(ctx, c, sdk, newProxy(bareNS, i)) }); err != nil {
			b.Fatal(err)
		}
		bareReady.wait(b, nil)
		bareTime += time.Since(t0)
		bareCalls += ec2Calls(fake) - calls0
		if err := c.DeleteAllOf(ctx, &crawlv1alpha1.Proxy{}, client.InNamespace(bareNS)); err != nil {
			b.Fatal(err)
		}

		op, _ := w.startOperator(b)
		ns := fmt.Sprintf("operator-aws-%d", round)
		mustNamespace(b, c, ns)
		ready := watchReady(b, w.cluster, ns, n)
		calls0 = ec2Calls(fake)
		t0 = time.Now()
		if err := forEach(n, func(i int) error { return c.Create(ctx, newProxy(ns, i)) }); err != nil {
			b.Fatal(err)
		}
		ready.wait(b, op)
		opTime += time.Since(t0)
		opCalls += ec2Calls(fake) - calls0
		b.Logf("EC2 calls by action after round %d: RunInstances %d, DescribeInstances %d, security groups %d",
			round, fake.Calls("RunInstances"), fake.Calls("DescribeInstances"), fake.Calls("DescribeSecurityGroups")+fake.Calls("CreateSecurityGroup"))
		op.Stop()
	}
	total := float64(round * n)
	b.ReportMetric(opTime.Seconds()/float64(round), "operator_s")
	b.ReportMetric(bareTime.Seconds()/float64(round), "bare_s")
	b.ReportMetric(opCalls/total, "operator_ec2_calls/proxy")
	b.ReportMetric(bareCalls/total, "bare_ec2_calls/proxy")
	b.ReportMetric(0, "ns/op")
}

// ec2Calls is how many calls the fake has answered, of every action (EC2's
// and the lease keys' SSM calls).
func ec2Calls(fake *fakeec2.Server) float64 {
	n := 0
	for _, action := range []string{"RunInstances", "DescribeInstances", "TerminateInstances", "CreateSecurityGroup",
		"DescribeSecurityGroups", "AuthorizeSecurityGroupIngress", "RevokeSecurityGroupIngress", "DeleteSecurityGroup",
		"PutParameter", "DeleteParameter"} {
		n += fake.Calls(action)
	}
	return float64(n)
}

// bareSDK are the SDK clients the bare loop calls.
type bareSDK struct {
	ec2 *ec2.Client
	ssm *ssm.Client
}

// bareEC2BringUp does only what bringing one proxy up on EC2 takes: the
// Proxy, its lease key in Parameter Store, one RunInstances with the same
// user-data, tags and token as the provider's, DescribeInstances until the
// instance runs with its public IP, and the Proxy's status.
func bareEC2BringUp(ctx context.Context, c client.Client, sdk bareSDK, p *crawlv1alpha1.Proxy) error {
	if err := c.Create(ctx, p); err != nil {
		return err
	}
	parameter := "/egress-proxy/" + p.Namespace + "-" + p.Name
	if _, err := sdk.ssm.PutParameter(ctx, &ssm.PutParameterInput{Name: awssdk.String(parameter), Type: ssmtypes.ParameterTypeSecureString,
		Value: awssdk.String("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n")}); err != nil {
		return err
	}
	userData, err := squidconf.VMCloudInit(squidconf.VMParams{Owner: p.Namespace + "/" + p.Name, Port: p.Spec.Port,
		AllowedSources: []string{"127.0.0.0/8"}, LeaseKey: squidconf.ParameterStoreKey(parameter, awsBenchRegion, "https://ssm.eu-west-1.amazonaws.com")})
	if err != nil {
		return err
	}
	tags := []types.Tag{{Key: awssdk.String("Name"), Value: awssdk.String(p.Namespace + "-" + p.Name)},
		{Key: awssdk.String("crawl.example.com/port"), Value: awssdk.String(strconv.Itoa(int(p.Spec.Port)))},
		{Key: awssdk.String("crawl.example.com/lease-key-parameter"), Value: awssdk.String(parameter)},
		{Key: awssdk.String(crawlv1alpha1.LabelOwnerUID), Value: awssdk.String(string(p.UID))}}
	run, err := sdk.ec2.RunInstances(ctx, &ec2.RunInstancesInput{
		MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1), ImageId: awssdk.String("ami-0debian12"),
		InstanceType: types.InstanceType("t3.micro"), ClientToken: awssdk.String(string(p.UID)),
		Placement:         &types.Placement{AvailabilityZone: awssdk.String(awsBenchZone)},
		UserData:          awssdk.String(base64.StdEncoding.EncodeToString([]byte(userData))),
		MetadataOptions:   &types.InstanceMetadataOptionsRequest{HttpTokens: types.HttpTokensStateRequired},
		NetworkInterfaces: []types.InstanceNetworkInterfaceSpecification{{DeviceIndex: awssdk.Int32(0), AssociatePublicIpAddress: awssdk.Bool(true)}},
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance, Tags: tags}},
	})
	if err != nil {
		return fmt.Errorf("running %s: %w", p.Name, err)
	}
	id := awssdk.ToString(run.Instances[0].InstanceId)
	var ip string
	for ip == "" {
		out, err := sdk.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
		if err != nil {
			return fmt.Errorf("describing %s: %w", id, err)
		}
		for _, r := range out.Reservations {
			for _, in := range r.Instances {
				if in.State != nil && in.State.Name == types.InstanceStateNameRunning {
					ip = awssdk.ToString(in.PublicIpAddress)
				}
			}
		}
	}
	p.Status = crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: p.Spec.Port, InstanceName: p.Namespace + "-" + p.Name}
	meta.SetStatusCondition(&p.Status.Conditions, readyCondition())
	return c.Status().Update(ctx, p)
}
