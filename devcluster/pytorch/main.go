// Command pytorch-controller runs the Kubeflow training-operator's own PyTorchJob reconciler
// and validating webhook (github.com/kubeflow/training-operator, pinned in go.mod) beside the
// devcluster's control plane.
//
// It differs from the module's cmd/training-operator.v1 only in how it starts: that command
// always rotates its webhook certificate into a Secret for the in-cluster Service DNS name
// (training-operator.kubeflow.svc) and serves on every interface, which a control plane on
// loopback cannot reach. Here the webhook is served on --webhook-host:--webhook-port with the
// certificate found in --cert-dir (the devcluster's serving certificate for 127.0.0.1), and only
// the PyTorchJob scheme is set up; no gang scheduler, leader election or metrics.
package main

import (
	"flag"
	"os"

	"go.uber.org/zap/zapcore"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"github.com/kubeflow/training-operator/pkg/config"
	controllerv1 "github.com/kubeflow/training-operator/pkg/controller.v1"
	"github.com/kubeflow/training-operator/pkg/controller.v1/common"
	"github.com/kubeflow/training-operator/pkg/webhooks"
)

func main() {
	var probeAddr, webhookHost, certDir string
	var webhookPort, controllerThreads int
	flag.StringVar(&probeAddr, "health-probe-bind-address", "127.0.0.1:8081", "The address the probe endpoint binds to.")
	flag.StringVar(&webhookHost, "webhook-host", "127.0.0.1", "The address the webhook server listens on.")
	flag.IntVar(&webhookPort, "webhook-port", 9443, "The port the webhook server listens on.")
	flag.StringVar(&certDir, "cert-dir", "", "Folder holding tls.crt and tls.key for the webhook server.")
	flag.IntVar(&controllerThreads, "controller-threads", 1, "Number of worker threads of the controller.")
	// The worker pods' init container (it waits for the master's Service), as the module's
	// command sets it up.
	flag.StringVar(&config.Config.PyTorchInitContainerImage, "pytorch-init-container-image",
		config.PyTorchInitContainerImageDefault, "The image for pytorch init container")
	flag.StringVar(&config.Config.PyTorchInitContainerTemplateFile, "pytorch-init-container-template-file",
		config.PyTorchInitContainerTemplateFileDefault, "The template file for pytorch init container")
	flag.IntVar(&config.Config.PyTorchInitContainerMaxTries, "pytorch-init-container-max-tries",
		config.PyTorchInitContainerMaxTriesDefault, "The number of tries for the pytorch init container")
	opts := zap.Options{Development: false, StacktraceLevel: zapcore.DPanicLevel}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")
	if certDir == "" {
		log.Error(nil, "--cert-dir is required: the folder with the webhook's tls.crt and tls.key")
		os.Exit(2)
	}

	scheme := clientgoscheme.Scheme
	utilruntime.Must(kubeflowv1.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		WebhookServer:          webhook.NewServer(webhook.Options{Host: webhookHost, Port: webhookPort, CertDir: certDir}),
		HealthProbeBindAddress: probeAddr,
	})
	if err != nil {
		log.Error(err, "unable to create the manager")
		os.Exit(1)
	}
	kind := kubeflowv1.PyTorchJobKind
	if err := controllerv1.SupportedSchemeReconciler[kind](mgr, common.GenNonGangSchedulerSetupFunc(), controllerThreads); err != nil {
		log.Error(err, "unable to set up the PyTorchJob controller")
		os.Exit(1)
	}
	if err := webhooks.SupportedSchemeWebhook[kind](mgr); err != nil {
		log.Error(err, "unable to set up the PyTorchJob webhook")
		os.Exit(1)
	}
	utilruntime.Must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	utilruntime.Must(mgr.AddReadyzCheck("readyz", mgr.GetWebhookServer().StartedChecker()))
	log.Info("starting the PyTorchJob controller", "webhook", webhookHost, "port", webhookPort)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "the manager stopped")
		os.Exit(1)
	}
}
